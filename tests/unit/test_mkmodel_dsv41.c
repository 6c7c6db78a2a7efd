/* tests/unit/test_mkmodel_dsv41.c - `mkmodel --arch deepseek_v41` (tools/mkmodel_dsv41.c): the
 * released layout (config.json with text_config and the released key names, inference/config.json
 * with ModelArgs names, both describing the same model), the tensor names, dtypes and shapes of
 * every kind of weight (FP8 linears with [ceil(out/32)][ceil(in/32)] ue8m0 scales, MXFP4 experts,
 * bf16/f32 tensors, Engram tables in the second shard, DSpark stages), the Engram row counts
 * (sums of the layout's primes) and compressed vocab (the tokenizer's map), byte-identical
 * output for the same seed, --engram-rows, and refused options naming the option. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/model/engram_hash.h"
#include "runner/model/safetensors.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"

static char g_dir[64];
static const char *g_build;

static int mk(const char *sub, const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "'%s/mkmodel' --arch deepseek_v41 --out '%s/%s' %s >/dev/null 2>'%s/err'", g_build,
             g_dir, sub, args, g_dir);
    return system(cmd);
}

static void expect_tensor(const tm_st_set *s, const char *name, tm_dtype dt, uint64_t d0,
                          uint64_t d1) {
    const tm_st_tensor *t = tm_st_set_find(s, name);
    TM_CHECK_MSG(t != NULL, "%s missing", name);
    if (!t)
        return;
    TM_CHECK_MSG(t->dtype == dt, "%s: dtype %s", name, tm_dtype_name(t->dtype));
    TM_CHECK_MSG(t->shape[0] == d0 && (d1 == 0 ? t->n_dim == 1 : t->shape[1] == d1),
                 "%s: shape %llu x %llu", name, (unsigned long long)t->shape[0],
                 (unsigned long long)(t->n_dim > 1 ? t->shape[1] : 0));
}

static void test_default_layout(void) {
    TM_CHECK(mk("a",
                "--dspark 1 --layers 5 --compress-ratios 0,2,2,1,1,0 --index-sources 1,3,4 "
                "--candidate-source 3 --candidate-topk-blocks 2 --candidate-block-size 2") == 0);
    char p[256];
    json_error_t je;
    snprintf(p, sizeof(p), "%s/a/config.json", g_dir);
    json_t *c = json_load_file(p, 0, &je);
    snprintf(p, sizeof(p), "%s/a/inference/config.json", g_dir);
    json_t *ma = json_load_file(p, 0, &je);
    TM_CHECK(c && ma);
    if (!c || !ma)
        return;
    json_t *t = json_object_get(c, "text_config");
    TM_CHECK(!strcmp(json_string_value(json_object_get(c, "model_type")), "deepseek_v41"));
    TM_CHECK(!strcmp(json_string_value(json_object_get(t, "model_type")), "deepseek_v41_text"));
    json_t *q = json_object_get(c, "quantization_config");
    TM_CHECK(!strcmp(json_string_value(json_object_get(q, "quant_method")), "fp8"));
    TM_CHECK(!strcmp(json_string_value(json_object_get(q, "scale_fmt")), "ue8m0"));
    TM_CHECK(!strcmp(json_string_value(json_object_get(q, "expert_dtype")), "fp4"));
    TM_CHECK(json_integer_value(json_array_get(json_object_get(q, "weight_block_size"), 1)) == 32);
    // The same model under both spellings.
    static const char *const pairs[][2] = {
        {"dim", "hidden_size"},
        {"n_layers", "num_hidden_layers"},
        {"n_activated_experts", "num_experts_per_tok"},
        {"window_size", "sliding_window"},
        {"engram_pad_id", "engram_pad_token_id"},
        {"n_mtp_layers", "num_nextn_predict_layers"},
        {"kv_source_layers", "kv_source_layer_ids"},
        {"index_source_layers", "index_source_layer_ids"},
        {"candidate_source_layer", "candidate_source_layer_id"},
        {"engram_num_embeddings", "engram_num_embeddings"},
        {"engram_compressed_vocab_size", "engram_compressed_vocab_size"},
        {"compress_ratios", "compress_ratios"},
        {"dspark_n_activated_experts", "dspark_num_experts_per_tok"},
        {"norm_eps", "rms_norm_eps"},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++)
        TM_CHECK_MSG(json_equal(json_object_get(ma, pairs[i][0]), json_object_get(t, pairs[i][1])),
                     "%s / %s", pairs[i][0], pairs[i][1]);
    TM_CHECK(json_integer_value(json_object_get(json_object_get(t, "rope_scaling"),
                                                "original_max_position_embeddings")) ==
             json_integer_value(json_object_get(ma, "original_seq_len")));
    // Engram rows are the layout's prime sums; the compressed vocab is the tokenizer's map.
    json_t *ne = json_object_get(ma, "engram_num_embeddings");
    TM_CHECK(json_integer_value(json_array_get(ne, 0)) == 420 &&
             json_integer_value(json_array_get(ne, 1)) == 508);
    TM_CHECK(json_integer_value(json_object_get(ma, "engram_compressed_vocab_size")) == 368);
    tm_tokenizer *tok = NULL;
    tm_err err = {0};
    snprintf(p, sizeof(p), "%s/a", g_dir);
    TM_CHECK_OK(tm_tok_load(p, &tok, &err), &err);
    if (tok) {
        TM_CHECK(json_integer_value(json_object_get(c, "image_token_id")) ==
                 tm_tok_find(tok, "<\xef\xbd\x9c"
                                  "deepseek_image\xef\xbd\x9c>"));
        TM_CHECK(tm_tok_n_vocab(tok) == 512);
    }
    tm_tok_destroy(tok);
    // Tensors: every kind once.
    tm_st_set *s = NULL;
    TM_CHECK_OK(tm_st_set_open(p, &s, &err), &err);
    if (s) {
        const tm_dtype F8 = TM_DTYPE_F8_E4M3, E8 = TM_DTYPE_F8_E8M0, BF = TM_DTYPE_BF16,
                       F32 = TM_DTYPE_F32;
        expect_tensor(s, "embed.weight", BF, 512, 64);
        expect_tensor(s, "head.weight", BF, 512, 64);
        expect_tensor(s, "norm.weight", BF, 64, 0);
        expect_tensor(s, "layers.0.attn.attn_sink", F32, 4, 0);
        expect_tensor(s, "layers.0.attn.wq_a.weight", F8, 64, 64);
        expect_tensor(s, "layers.0.attn.wq_a.scale", E8, 2, 2);
        expect_tensor(s, "layers.0.attn.wq_b.weight", F8, 256, 64);
        expect_tensor(s, "layers.0.attn.wq_b.scale", E8, 8, 2);
        expect_tensor(s, "layers.0.attn.wo_a.weight", F8, 128, 64); // 4 groups x 32, 4*64/4
        expect_tensor(s, "layers.0.attn.wo_a.scale", E8, 4, 2);
        expect_tensor(s, "layers.0.attn.wo_b.weight", F8, 64, 128);
        expect_tensor(s, "layers.0.attn.kv_norm.weight", BF, 64, 0);
        expect_tensor(s, "layers.1.attn.compressor.wkv.weight", BF, 64, 64);
        expect_tensor(s, "layers.1.attn.compressor.wgate.weight", BF, 64, 64);
        expect_tensor(s, "layers.1.attn.indexer.wq_b.weight", F8, 128, 64);
        expect_tensor(s, "layers.1.attn.indexer.wk.weight", BF, 32, 64);
        expect_tensor(s, "layers.1.attn.indexer.weights_proj.weight", BF, 4, 64);
        expect_tensor(s, "layers.3.attn.compressor.wkv.weight", BF, 64, 64);
        TM_CHECK(!tm_st_set_find(s, "layers.3.attn.compressor.wgate.weight")); // ratio 1
        TM_CHECK(!tm_st_set_find(s, "layers.2.attn.compressor.wkv.weight"));   // not a source
        expect_tensor(s, "layers.4.attn.indexer.wq_b.weight", F8, 128, 64);
        TM_CHECK(!tm_st_set_find(s, "layers.4.attn.indexer.wk.weight")); // not a kv source
        expect_tensor(s, "layers.0.ffn.gate.weight", BF, 4, 64);
        expect_tensor(s, "layers.0.ffn.gate.bias", F32, 4, 0);
        expect_tensor(s, "layers.0.ffn.experts.3.w1.weight", TM_DTYPE_I8, 64, 32);
        expect_tensor(s, "layers.0.ffn.experts.3.w1.scale", E8, 64, 2);
        expect_tensor(s, "layers.0.ffn.experts.3.w2.weight", TM_DTYPE_I8, 64, 32);
        expect_tensor(s, "layers.0.ffn.shared_experts.w2.weight", F8, 64, 64);
        expect_tensor(s, "layers.0.hc_attn_fn", F32, 24, 256);
        expect_tensor(s, "layers.0.hc_ffn_base", F32, 24, 0);
        expect_tensor(s, "layers.0.hc_attn_scale", F32, 3, 0);
        expect_tensor(s, "layers.0.engram.embed.weight", F8, 420, 32);
        expect_tensor(s, "layers.0.engram.embed.scale", E8, 420, 1);
        expect_tensor(s, "layers.2.engram.embed.weight", F8, 508, 32);
        expect_tensor(s, "layers.0.engram.wkv.weight", F8, 320, 128); // 64*(4+1), (3-1)*2*32
        expect_tensor(s, "layers.0.engram.wkv.scale", E8, 10, 4);
        expect_tensor(s, "layers.0.engram.q_weight", BF, 4, 64);
        TM_CHECK(!tm_st_set_find(s, "layers.1.engram.wkv.weight"));
        expect_tensor(s, "mtp.0.attn.wq_a.weight", F8, 64, 64);
        expect_tensor(s, "mtp.0.main_proj.weight", F8, 64, 128); // targets 3,4
        expect_tensor(s, "mtp.0.main_norm.weight", BF, 64, 0);
        expect_tensor(s, "mtp.0.markov_head.embed.weight", BF, 512, 32);
        expect_tensor(s, "mtp.0.confidence_head.proj.weight", BF, 1, 96);
        TM_CHECK(!tm_st_set_find(s, "mtp.0.attn.compressor.wkv.weight"));
        TM_CHECK(!tm_st_set_find(s, "mtp.0.embed.weight"));
        const tm_st_tensor *tab = tm_st_set_find(s, "layers.0.engram.embed.weight");
        TM_CHECK(tab && !strcmp(tab->file, "model-00002-of-00002.safetensors"));
    }
    tm_st_set_close(s);
    json_decref(c);
    json_decref(ma);
}

static void test_deterministic_and_rows(void) {
    TM_CHECK(mk("b1", "--seed 7") == 0 && mk("b2", "--seed 7") == 0 && mk("b3", "--seed 8") == 0);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && cmp -s b1/model-00001-of-00002.safetensors "
             "b2/model-00001-of-00002.safetensors && cmp -s b1/model-00002-of-00002.safetensors "
             "b2/model-00002-of-00002.safetensors && ! cmp -s b1/model-00002-of-00002.safetensors "
             "b3/model-00002-of-00002.safetensors && cmp -s b1/config.json b3/config.json",
             g_dir);
    TM_CHECK_MSG(system(cmd) == 0, "%s", cmd);
    // --engram-rows: engram_vocab_size = rows / ((3-1)*2), table rows = the prime sums.
    TM_CHECK(mk("c", "--engram-rows 40000 --engram-layers 1") == 0);
    char p[256];
    json_error_t je;
    snprintf(p, sizeof(p), "%s/c/inference/config.json", g_dir);
    json_t *ma = json_load_file(p, 0, &je);
    TM_CHECK(ma != NULL);
    if (ma) {
        TM_CHECK(json_integer_value(json_object_get(ma, "engram_vocab_size")) == 10000);
        uint32_t id = 1;
        uint64_t big = UINT64_MAX;
        tm_engram_params prm = {.n_layer = 1,
                                .layer_ids = &id,
                                .num_embeddings = &big,
                                .max_ngram = 3,
                                .n_heads = 2,
                                .head_dim = 32,
                                .vocab_size = 10000,
                                .compressed_vocab = 368,
                                .pad_compressed = 2};
        tm_engram_layout *L = NULL;
        tm_err err = {0};
        TM_CHECK_OK(tm_engram_layout_create(&prm, &L, &err), &err);
        if (L)
            TM_CHECK(json_integer_value(json_array_get(json_object_get(ma, "engram_num_embeddings"),
                                                       0)) == (json_int_t)L->rows_used[0]);
        tm_engram_layout_destroy(L);
    }
    json_decref(ma);
}

static void test_refusals(void) {
    static const struct {
        const char *args, *needle;
    } bad[] = {
        {"--dim 48", "--dim (48)"},
        {"--compress-ratios 0,2", "--compress-ratios has 2 entries"},
        {"--kv-sources 0", "kv source layer 0"},
        {"--engram-layers 9", "engram layer 9"},
        {"--heads 3", "--heads 3"},
        {"--bogus 1", "--bogus"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        TM_CHECK_MSG(mk("bad", bad[i].args) != 0, "%s accepted", bad[i].args);
        char cmd[512];
        snprintf(cmd, sizeof(cmd), "grep -qF -- '%s' '%s/err'", bad[i].needle, g_dir);
        TM_CHECK_MSG(system(cmd) == 0, "%s: message lacks \"%s\"", bad[i].args, bad[i].needle);
    }
}

int main(void) {
    g_build = getenv("TM_BUILD") ? getenv("TM_BUILD") : "build";
    snprintf(g_dir, sizeof(g_dir), "/tmp/tm_mkmodel_dsv41_XXXXXX");
    if (!mkdtemp(g_dir))
        return 1;
    TM_RUN(test_default_layout);
    TM_RUN(test_deterministic_and_rows);
    TM_RUN(test_refusals);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    TM_CHECK(system(cmd) == 0);
    return tm_test_report();
}
