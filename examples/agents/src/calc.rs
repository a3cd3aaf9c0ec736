//! Arithmetic expressions: numbers, `+ - * / ^`, unary minus and
//! parentheses, with the usual precedence (`^` binds tightest and to the
//! right).

/// The value of `expression`, or what is wrong with it.
pub fn evaluate(expression: &str) -> Result<f64, String> {
    let mut parser = Parser { text: expression.as_bytes(), at: 0 };
    let value = parser.sum()?;
    parser.skip_spaces();
    if parser.at < parser.text.len() {
        return Err(format!("unexpected `{}` at position {}", char::from(parser.text[parser.at]), parser.at + 1));
    }
    if value.is_finite() { Ok(value) } else { Err("the result is not a finite number (a division by zero?)".into()) }
}

struct Parser<'a> {
    text: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn skip_spaces(&mut self) {
        while self.text.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    /// The next byte after spaces, consumed when it is one of `ops`.
    fn take(&mut self, ops: &[u8]) -> Option<u8> {
        self.skip_spaces();
        let next = *self.text.get(self.at)?;
        ops.contains(&next).then(|| {
            self.at += 1;
            next
        })
    }

    fn sum(&mut self) -> Result<f64, String> {
        let mut value = self.product()?;
        while let Some(op) = self.take(b"+-") {
            let rhs = self.product()?;
            value = if op == b'+' { value + rhs } else { value - rhs };
        }
        Ok(value)
    }

    fn product(&mut self) -> Result<f64, String> {
        let mut value = self.power()?;
        while let Some(op) = self.take(b"*/") {
            let rhs = self.power()?;
            value = if op == b'*' { value * rhs } else { value / rhs };
        }
        Ok(value)
    }

    fn power(&mut self) -> Result<f64, String> {
        let base = self.unary()?;
        if self.take(b"^").is_some() {
            return Ok(base.powf(self.power()?));
        }
        Ok(base)
    }

    fn unary(&mut self) -> Result<f64, String> {
        if self.take(b"-").is_some() {
            return Ok(-self.unary()?);
        }
        if self.take(b"(").is_some() {
            let value = self.sum()?;
            return match self.take(b")") {
                Some(_) => Ok(value),
                None => Err(format!("a `)` is missing at position {}", self.at + 1)),
            };
        }
        self.number()
    }

    fn number(&mut self) -> Result<f64, String> {
        self.skip_spaces();
        let start = self.at;
        while self.text.get(self.at).is_some_and(|b| b.is_ascii_digit() || *b == b'.') {
            self.at += 1;
        }
        let digits = std::str::from_utf8(&self.text[start..self.at]).unwrap_or_default();
        if digits.is_empty() {
            return Err(match self.text.get(self.at) {
                Some(b) => format!("expected a number at position {}, found `{}`", self.at + 1, char::from(*b)),
                None => "the expression ends where a number should be".into(),
            });
        }
        digits.parse().map_err(|_| format!("`{digits}` is not a number"))
    }
}

#[cfg(test)]
mod tests {
    use super::evaluate;

    #[test]
    fn precedence_parentheses_and_errors() {
        assert_eq!(evaluate("100 * 250 * 18"), Ok(450_000.0));
        assert_eq!(evaluate("1 + 2 * 3"), Ok(7.0));
        assert_eq!(evaluate("(1 + 2) * 3"), Ok(9.0));
        assert_eq!(evaluate("2 ^ 3 ^ 2"), Ok(512.0));
        assert_eq!(evaluate("-2 * -3.5"), Ok(7.0));
        assert!(evaluate("1 / 0").unwrap_err().contains("division by zero"));
        assert!(evaluate("1 +").unwrap_err().contains("ends"));
        assert!(evaluate("2 x 3").unwrap_err().contains("unexpected `x`"));
        assert!(evaluate("(1 + 2").unwrap_err().contains("missing"));
    }
}
