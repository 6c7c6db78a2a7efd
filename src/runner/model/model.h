/* runner/model/model.h - a loaded Hugging Face model folder: the parsed config.json and the
 * weights, memory-mapped from *.safetensors (one file or shards listed in
 * model.safetensors.index.json). Tensors point into the mappings; nothing is copied. Immutable
 * after load, so any number of threads may read it. Supports the Llama family (LlamaForCausalLM,
 * Qwen2ForCausalLM, MistralForCausalLM) and DeepseekV4ForCausalLM (its config and weights:
 * runner/model/model_dsv4.h). The types (config, layer weights, tm_model) are in
 * runner/model/model_types.h. */
#ifndef TM_RUNNER_MODEL_MODEL_H
#define TM_RUNNER_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/model/model_types.h"

/* Load dir/config.json (+ generation_config.json if present) and map the safetensors. Every
 * header field is validated before use; a truncated or inconsistent file gives TM_E_PARSE with a
 * message naming the file and the rule. On success *out owns the model. Config: architectures[0]
 * (model_type if absent); rope_scaling or rope_parameters of type default or llama3; eos ids of
 * both files merged without repeats; every tensor's shape checked against the config (extra
 * tensors are ignored, except layers beyond num_hidden_layers). Errors: TM_E_PARSE (malformed or
 * inconsistent files, missing fields, values out of range, wrong shapes), TM_E_INVAL (valid but
 * unsupported: other architectures or rope types, attention_bias/mlp_bias on Llama, Qwen2
 * sliding windows, hidden_act other than silu), TM_E_IO, TM_E_NOMEM. Messages start with
 * "loading model <dir>: ". impl is the tm_st_set (runner/model/safetensors.h) holding the mappings.
 */
tm_rc tm_model_load(const char *dir, tm_model **out, tm_err *err);
void tm_model_destroy(tm_model *m); /* NULL is a no-op */
/* Whether the weights files are still the ones loaded (issue 35; tm_st_set_check): TM_E_IO
 * naming the file that lost bytes under its mapping (the weights read from it since are zeros,
 * not the model's), or that was replaced, removed or changed since load. TM_OK for a model built
 * in memory. One stat per shard; thread-safe. */
tm_rc tm_model_check_files(const tm_model *m, tm_err *err);
/* The configuration alone (config.json + generation_config.json, parsed and checked as
 * tm_model_load does; no weights opened): what a benchmark of random weights of a real model's
 * shape needs. Llama family only (TM_E_INVAL for DeepSeek-V4). */
tm_rc tm_model_cfg_load(const char *dir, tm_model_cfg *cfg, tm_err *err);

/* "llama", "qwen2", "mistral" or "deepseek_v4": its architecture's name (runner/model/arch.h). */
const char *tm_model_arch_name(const tm_model *m);
/* 1 if m's checkpoint has a drafter for speculative decoding (DeepSeek-V4's MTP layer), else 0. */
int tm_model_has_drafter(const tm_model *m);

/* Check that every Llama-family weight of m is present, of a float dtype (f32, f16, bf16) and of
 * the shape its cfg implies (for models built in memory too, which skip tm_model_load's checks).
 * Quantized weights are refused: this is the check of engines that read weights as plain
 * arrays. who starts the message ("cpu engine"). TM_E_INVAL naming the layer and tensor. */
tm_rc tm_model_check_weights(const tm_model *m, const char *who, tm_err *err);
/* The same, but the seven linears of each layer may also be quantized views (their scales
 * present, their scheme known): the check of engines that read weight rows through
 * tm_tensor_row_f32. */
tm_rc tm_model_check_weights_quant(const tm_model *m, const char *who, tm_err *err);
/* 1 if any weight of m is quantized (Llama family and DeepSeek-V4), else 0. */
int tm_model_is_quantized(const tm_model *m);

/* Whether tm_model_quantize_fp8 can quantize m: a Llama-family model whose linears are all float
 * (f32, f16, bf16) and with no quantization_config. TM_E_INVAL otherwise: DeepSeek-V4 (its FP8
 * format is 128x128 block-scaled, not per channel) or a checkpoint that is already quantized
 * (the message names its scheme). Any thread. */
tm_rc tm_model_quantize_fp8_check(const tm_model *m, tm_err *err);
/* Quantize the seven linears (q/k/v/o/gate/up/down) of every layer of m to FP8 e4m3 with one
 * fp32 scale per output row, by tm_quant_fp8_row (runner/model/quant.h): the weights become
 * quantized views (TM_QUANT_FP8_CHANNEL, scale [out] f32) exactly like those of a
 * compressed-tensors per-channel checkpoint of the same values, and cfg.quant says so
 * (compressed-tensors, channel, dynamic activations). Embeddings, norms, biases and lm_head are
 * untouched. The codes and scales are one allocation owned by m (freed by tm_model_destroy); the
 * float weights stay mapped but are no longer read. Uses n_threads threads (the caller's included;
 * 0 or 1: the caller's only). Call it before any engine is made from m (it changes the views);
 * not thread-safe with readers of m. On error m is unchanged. Errors: those of
 * tm_model_quantize_fp8_check, TM_E_INVAL naming the tensor for a row with an infinity,
 * TM_E_NOMEM. */
tm_rc tm_model_quantize_fp8(tm_model *m, uint32_t n_threads, tm_err *err);

/* The RoPE inverse frequencies of a Llama-family cfg, which both engines use:
 * inv_freq[i] = 1/theta^(2i/d) for i < d/2 (d = cfg->head_dim), with the llama3 rescaling when
 * cfg->rope_type says so. fp32 math in the order HF uses. inv_freq holds head_dim / 2 floats.
 * Pure; any thread. */
void tm_model_rope_inv_freq(const tm_model_cfg *cfg, float *inv_freq);

#endif /* TM_RUNNER_MODEL_MODEL_H */
