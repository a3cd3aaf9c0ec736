//! A circuit breaker per agent: after `threshold` consecutive failures that
//! are the agent's fault (it did not answer, or answered 5xx), calls to it
//! fail at once with a clear error for `cooldown`; then one probe call goes
//! through, and its outcome closes or reopens the circuit.
//!
//! Written here rather than taken from a crate: the maintained ones do not
//! have these semantics. `failsafe` lets every call through while half-open
//! (no single probe); `tower-circuitbreaker` opens on a failure rate over a
//! window rather than on consecutive failures, and admits concurrent calls
//! while a probe runs. Both would also count a 4xx answer, which says
//! nothing of the agent's health, as a failure unless wrapped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A circuit's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Circuit {
    /// Calls go through.
    Closed,
    /// One probe call is in flight; others fail fast.
    HalfOpen,
    /// Calls fail fast.
    Open,
}

impl Circuit {
    /// The value of the circuit-state gauge (0 closed, 1 half-open, 2 open).
    pub fn gauge(self) -> i64 {
        match self {
            Self::Closed => 0,
            Self::HalfOpen => 1,
            Self::Open => 2,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen,
}

/// A call the breaker let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// The call is the probe of a half-open circuit.
    pub probe: bool,
}

/// The breakers of every agent.
#[derive(Debug)]
pub struct Breakers {
    threshold: u32,
    cooldown: Duration,
    agents: Mutex<HashMap<String, State>>,
}

impl Breakers {
    /// Opens after `threshold` consecutive failures (0: never), for `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Self { threshold, cooldown, agents: Mutex::new(HashMap::new()) }
    }

    /// Lets a call to `agent` through, or says why not.
    pub fn admit(&self, agent: &str) -> Result<Admission, String> {
        if self.threshold == 0 {
            return Ok(Admission { probe: false });
        }
        let mut agents = self.agents.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let state = agents.entry(agent.to_owned()).or_insert(State::Closed { failures: 0 });
        match *state {
            State::Closed { .. } => Ok(Admission { probe: false }),
            State::Open { until } if Instant::now() >= until => {
                *state = State::HalfOpen;
                Ok(Admission { probe: true })
            }
            State::Open { until } => Err(format!(
                "circuit open for agent `{agent}` after {} consecutive failures; calls fail fast for {} ms more",
                self.threshold,
                until.saturating_duration_since(Instant::now()).as_millis()
            )),
            State::HalfOpen => Err(format!("circuit half-open for agent `{agent}`: a probe call is in flight")),
        }
    }

    /// Forgets a probe that will never be recorded (its step was cancelled
    /// or its task dropped): the circuit goes back to open with the
    /// cooldown over, so that the next call is the new probe, instead of
    /// staying half-open for good.
    pub fn abandon(&self, agent: &str, admission: Admission) {
        if !admission.probe || self.threshold == 0 {
            return;
        }
        let mut agents = self.agents.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(state @ State::HalfOpen) = agents.get_mut(agent) {
            *state = State::Open { until: Instant::now() };
        }
    }

    /// Records a call's outcome; `agent_fault` is false for answers that
    /// say nothing of the agent's health (a 4xx is the caller's problem).
    /// Returns the circuit's new state.
    pub fn record(&self, agent: &str, admission: Admission, agent_fault: bool) -> Circuit {
        if self.threshold == 0 {
            return Circuit::Closed;
        }
        let mut agents = self.agents.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let state = agents.entry(agent.to_owned()).or_insert(State::Closed { failures: 0 });
        *state = match (*state, agent_fault) {
            (_, false) if admission.probe || matches!(state, State::Closed { .. }) => State::Closed { failures: 0 },
            (State::HalfOpen, true) => State::Open { until: Instant::now() + self.cooldown },
            (State::Closed { failures }, true) if failures + 1 >= self.threshold => {
                tracing::warn!(agent_id = agent, failures = failures + 1, "circuit opened");
                State::Open { until: Instant::now() + self.cooldown }
            }
            (State::Closed { failures }, true) => State::Closed { failures: failures + 1 },
            // An answer from a call admitted before the circuit opened.
            (other, _) => other,
        };
        match *state {
            State::Closed { .. } => Circuit::Closed,
            State::HalfOpen => Circuit::HalfOpen,
            State::Open { .. } => Circuit::Open,
        }
    }
}

/// A call let through, recorded when it ends: dropped unrecorded (the
/// step cancelled mid-call), its probe is abandoned ([`Breakers::abandon`]).
pub struct Admitted<'a> {
    breakers: &'a Breakers,
    agent: &'a str,
    admission: Option<Admission>,
}

impl<'a> Admitted<'a> {
    /// Lets a call to `agent` through, or says why not.
    pub fn new(breakers: &'a Breakers, agent: &'a str) -> Result<Self, String> {
        Ok(Self { breakers, agent, admission: Some(breakers.admit(agent)?) })
    }

    /// Records the outcome ([`Breakers::record`]).
    pub fn record(mut self, agent_fault: bool) -> Circuit {
        match self.admission.take() {
            Some(admission) => self.breakers.record(self.agent, admission, agent_fault),
            None => Circuit::Closed,
        }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            self.breakers.abandon(self.agent, admission);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_abandoned_probe_frees_the_half_open_circuit() {
        let breakers = Breakers::new(1, Duration::from_millis(5));
        let call = Admitted::new(&breakers, "x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(call.record(true), Circuit::Open);
        std::thread::sleep(Duration::from_millis(10));
        let probe = Admitted::new(&breakers, "x").unwrap_or_else(|e| panic!("{e}"));
        assert!(Admitted::new(&breakers, "x").is_err(), "one probe at a time");
        // The step is cancelled mid-call: its probe is never recorded.
        drop(probe);
        let next = Admitted::new(&breakers, "x").unwrap_or_else(|e| panic!("the circuit stayed half-open: {e}"));
        assert_eq!(next.record(false), Circuit::Closed);
    }

    #[test]
    fn opens_after_consecutive_failures_and_closes_after_a_good_probe() {
        let breakers = Breakers::new(3, Duration::from_millis(30));
        for _ in 0..2 {
            let a = breakers.admit("x").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(breakers.record("x", a, true), Circuit::Closed);
        }
        let a = breakers.admit("x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(breakers.record("x", a, true), Circuit::Open);
        let refused = breakers.admit("x");
        assert!(refused.as_ref().is_err_and(|e| e.contains("circuit open for agent `x` after 3")), "{refused:?}");
        assert!(breakers.admit("y").is_ok(), "other agents are not affected");
        std::thread::sleep(Duration::from_millis(40));
        let probe = breakers.admit("x").unwrap_or_else(|e| panic!("{e}"));
        assert!(probe.probe);
        assert!(breakers.admit("x").is_err(), "one probe at a time");
        assert_eq!(breakers.record("x", probe, false), Circuit::Closed);
        assert!(breakers.admit("x").is_ok());
    }

    #[test]
    fn a_failed_probe_reopens_and_caller_errors_do_not_count() {
        let breakers = Breakers::new(1, Duration::from_millis(10));
        let a = breakers.admit("x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(breakers.record("x", a, false), Circuit::Closed, "a 4xx answer is not the agent's fault");
        let a = breakers.admit("x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(breakers.record("x", a, true), Circuit::Open);
        std::thread::sleep(Duration::from_millis(15));
        let probe = breakers.admit("x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(breakers.record("x", probe, true), Circuit::Open);
    }
}
