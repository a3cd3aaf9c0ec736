//! all-MiniLM-L6-v2 in process: the sentence-transformers model (a 6-layer
//! BERT, 384 dimensions) run with candle on the CPU, tokenized by its own
//! `tokenizer.json`, mean-pooled over the tokens and normalized, as
//! sentence-transformers does. About 90 MB of weights, a few milliseconds
//! per short text on one core.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use candle_core::{D, DType, Device, Tensor};
use tokenizers::{Tokenizer, TruncationParams};

use super::{Embedder, normalize};
use crate::LlmError;

/// Longest input in tokens (the model was trained on 256).
const MAX_TOKENS: usize = 256;
/// Texts run through the model at once.
const BATCH: usize = 32;

/// all-MiniLM-L6-v2 (or another BERT sentence model of the same shape).
#[derive(Clone)]
pub struct MiniLm {
    name: String,
    inner: Arc<Inner>,
}

struct Inner {
    tokenizer: Tokenizer,
    bert: Bert,
}

struct Linear {
    /// `[in, out]`: transposed once at load.
    weight: Tensor,
    bias: Tensor,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.matmul(&self.weight)?.broadcast_add(&self.bias)
    }
}

struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centred = x.broadcast_sub(&mean)?;
        let variance = centred.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centred.broadcast_div(&(variance + self.eps)?.sqrt()?)?;
        normed.broadcast_mul(&self.weight)?.broadcast_add(&self.bias)
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

struct Bert {
    words: Tensor,
    positions: Tensor,
    token_type: Tensor,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
}

/// The tensor `name` as `f32` (some exports prefix every name with `bert.`).
fn take(tensors: &mut HashMap<String, Tensor>, name: &str) -> Result<Tensor, String> {
    tensors
        .remove(name)
        .or_else(|| tensors.remove(&format!("bert.{name}")))
        .ok_or_else(|| format!("model.safetensors has no tensor `{name}`"))?
        .to_dtype(DType::F32)
        .map_err(|e| e.to_string())
}

fn config_usize(config: &serde_json::Value, key: &str) -> Result<usize, LlmError> {
    config
        .get(key)
        .and_then(serde_json::Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| LlmError::Config(format!("the model's config.json has no `{key}`")))
}

impl Bert {
    fn load(dir: &Path) -> Result<Self, LlmError> {
        let fail =
            |what: String| LlmError::Config(format!("loading the embedding model from {}: {what}", dir.display()));
        let config: serde_json::Value = std::fs::read(dir.join("config.json"))
            .map_err(|e| fail(format!("config.json: {e}")))
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| fail(format!("config.json: {e}"))))?;
        let layers = config_usize(&config, "num_hidden_layers")?;
        let heads = config_usize(&config, "num_attention_heads")?;
        let eps = config.get("layer_norm_eps").and_then(serde_json::Value::as_f64).unwrap_or(1e-12);
        let mut tensors: HashMap<String, Tensor> =
            candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)
                .map_err(|e| fail(format!("model.safetensors: {e}")))?;
        let mut take = |name: &str| take(&mut tensors, name).map_err(|e| fail(e.to_string()));
        let mut out_layers = Vec::with_capacity(layers);
        for i in 0..layers {
            let p = format!("encoder.layer.{i}");
            let mut linear = |prefix: &str| -> Result<Linear, LlmError> {
                let weight = take(&format!("{p}.{prefix}.weight"))?;
                let weight = weight.t().and_then(|w| w.contiguous()).map_err(|e| fail(e.to_string()))?;
                Ok(Linear { weight, bias: take(&format!("{p}.{prefix}.bias"))? })
            };
            let query = linear("attention.self.query")?;
            let key = linear("attention.self.key")?;
            let value = linear("attention.self.value")?;
            let attention_out = linear("attention.output.dense")?;
            let intermediate = linear("intermediate.dense")?;
            let output = linear("output.dense")?;
            out_layers.push(Layer {
                query,
                key,
                value,
                attention_out,
                attention_norm: LayerNorm {
                    weight: take(&format!("{p}.attention.output.LayerNorm.weight"))?,
                    bias: take(&format!("{p}.attention.output.LayerNorm.bias"))?,
                    eps,
                },
                intermediate,
                output,
                output_norm: LayerNorm {
                    weight: take(&format!("{p}.output.LayerNorm.weight"))?,
                    bias: take(&format!("{p}.output.LayerNorm.bias"))?,
                    eps,
                },
            });
        }
        Ok(Self {
            words: take("embeddings.word_embeddings.weight")?,
            positions: take("embeddings.position_embeddings.weight")?,
            token_type: take("embeddings.token_type_embeddings.weight")?,
            embedding_norm: LayerNorm {
                weight: take("embeddings.LayerNorm.weight")?,
                bias: take("embeddings.LayerNorm.bias")?,
                eps,
            },
            layers: out_layers,
            heads,
        })
    }

    /// Mean-pooled sentence vectors of a padded batch (`ids` and `mask`:
    /// `[batch, tokens]`).
    fn forward(&self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (batch, tokens) = ids.dims2()?;
        let hidden = self.words.dim(1)?;
        let head = hidden / self.heads;
        let words = self.words.index_select(&ids.flatten_all()?, 0)?.reshape((batch, tokens, hidden))?;
        let positions = self.positions.narrow(0, 0, tokens)?;
        let token_type = self.token_type.narrow(0, 0, 1)?;
        let mut x = self.embedding_norm.forward(&words.broadcast_add(&positions)?.broadcast_add(&token_type)?)?;
        // Padding gets a large negative score before the softmax.
        let mask_f = mask.to_dtype(DType::F32)?;
        let additive = ((mask_f.clone() - 1.0)? * 1e9)?.reshape((batch, 1, 1, tokens))?;
        let scale = 1.0 / (head as f64).sqrt();
        for layer in &self.layers {
            let flat = x.reshape((batch * tokens, hidden))?;
            let split = |t: Tensor| -> candle_core::Result<Tensor> {
                t.reshape((batch, tokens, self.heads, head))?.transpose(1, 2)?.contiguous()
            };
            let q = split(layer.query.forward(&flat)?)?;
            let k = split(layer.key.forward(&flat)?)?;
            let v = split(layer.value.forward(&flat)?)?;
            let scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?.broadcast_add(&additive)?;
            let max = scores.max_keepdim(D::Minus1)?;
            let exp = scores.broadcast_sub(&max)?.exp()?;
            let probs = exp.broadcast_div(&exp.sum_keepdim(D::Minus1)?)?;
            let context = probs.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((batch * tokens, hidden))?;
            let attended = layer.attention_norm.forward(&(layer.attention_out.forward(&context)? + &flat)?)?;
            let inner = layer.intermediate.forward(&attended)?.gelu_erf()?;
            let out = layer.output_norm.forward(&(layer.output.forward(&inner)? + &attended)?)?;
            x = out.reshape((batch, tokens, hidden))?;
        }
        let weights = mask_f.unsqueeze(2)?;
        let summed = x.broadcast_mul(&weights)?.sum(1)?;
        let counts = weights.sum(1)?.clamp(1e-9, f64::MAX)?;
        summed.broadcast_div(&counts)
    }
}

impl MiniLm {
    /// Loads `config.json`, `model.safetensors` and `tokenizer.json` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, LlmError> {
        let fail =
            |what: String| LlmError::Config(format!("loading the embedding model from {}: {what}", dir.display()));
        if !dir.join("model.safetensors").is_file() {
            return Err(fail("no model.safetensors there".into()));
        }
        let mut tokenizer =
            Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| fail(format!("tokenizer.json: {e}")))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: MAX_TOKENS, ..Default::default() }))
            .map_err(|e| fail(format!("tokenizer.json: {e}")))?;
        let bert = Bert::load(dir)?;
        let model = dir.file_name().map_or_else(|| "all-MiniLM-L6-v2".into(), |n| n.to_string_lossy().into_owned());
        Ok(Self { name: format!("local:{model}"), inner: Arc::new(Inner { tokenizer, bert }) })
    }

    /// The vectors of `texts`, computed on this thread.
    pub fn embed_now(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError> {
        let fail = |e: String| LlmError::InvalidResponse(format!("the embedding model failed: {e}"));
        // Similar lengths together: less padding.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        let encodings = self
            .inner
            .tokenizer
            .encode_batch(texts.iter().map(String::as_str).collect::<Vec<_>>(), true)
            .map_err(|e| fail(e.to_string()))?;
        order.sort_by_key(|&i| encodings[i].get_ids().len());
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(BATCH) {
            let longest = chunk.iter().map(|&i| encodings[i].get_ids().len()).max().unwrap_or(1).max(1);
            let mut ids = vec![0u32; chunk.len() * longest];
            let mut mask = vec![0u32; chunk.len() * longest];
            for (row, &i) in chunk.iter().enumerate() {
                for (col, &id) in encodings[i].get_ids().iter().enumerate() {
                    ids[row * longest + col] = id;
                    mask[row * longest + col] = 1;
                }
            }
            let shape = (chunk.len(), longest);
            let run = || -> candle_core::Result<Vec<Vec<f32>>> {
                let ids = Tensor::from_vec(ids, shape, &Device::Cpu)?;
                let mask = Tensor::from_vec(mask, shape, &Device::Cpu)?;
                self.inner.bert.forward(&ids, &mask)?.to_vec2::<f32>()
            };
            for (&i, v) in chunk.iter().zip(run().map_err(|e| fail(e.to_string()))?) {
                out[i] = normalize(v);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Embedder for MiniLm {
    fn name(&self) -> &str {
        &self.name
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError> {
        let model = self.clone();
        let texts = texts.to_vec();
        tokio::task::spawn_blocking(move || model.embed_now(&texts))
            .await
            .map_err(|e| LlmError::InvalidResponse(format!("the embedding task failed: {e}")))?
    }
}
