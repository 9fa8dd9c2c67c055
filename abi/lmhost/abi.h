/* lmhost plugin ABI: what every plugin kind shares.
 *
 * This directory is the plugin development kit: a plugin includes these headers and
 * nothing of the host. The ABI is versioned: a plugin built against another MAJOR is
 * refused; MINOR versions only append members to the end of tables, which carry their
 * own size so the host can tell which members a plugin knows of. */
#ifndef LMHOST_ABI_H
#define LMHOST_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LMH_ABI_MAJOR 1
#define LMH_ABI_MINOR                                                                              \
    13 /* 1: lmh_backend_api.read_bandwidth; 2: LMH_OP_ARGMAX;                                     \
        * 3: lmh_backend_api.download_start, download_wait; 4: lmh_backend_api.compute_peak;       \
        * 5: lmh_cache_api.bytes_read; 6: lmh_backend_api.kernel_add, kernel_run;                  \
        * 7: recurrent state (lmh_recurrent_state, lmh_host_api.declare_recurrent and              \
        *    fwd_recurrent, lmh_cache_config.recurrent, lmh_cache_api.recur and state_*),          \
        *    ops COLS, UNARY, CONV1D, SSM_SCAN, SSD_SCAN, DELTA_RULE and lmh_op.src_more,          \
        *    elementwise SIGMOID_GATE;                                                             \
        * 8: lmh_cache_config.options and flags, lmh_cache_api.read_rows, row_bytes;               \
        * 9: lmh_backend_opts.precision, lmh_backend_api.precision, LMH_MATMUL_EXACT               \
        *    (LMH_OP_MATMUL p.i[0]);                                                               \
        * 10: attention sinks (lmh_attn_params.sinks, LMH_ATTN_SINKS), LMH_OP_SWIGLU_OAI,          \
        *    LMH_OP_ROPE_SWITCH, lmh_batch.seq_ends, lmh_host_api.weight_transposed, LMH_MXFP4     \
        *    weights (tensor_quant); a plugin of a newer minor than the host's is refused;         \
        * 11: lmh_host_api.declare_moe, lmh_batch.moe_top_k, LMH_OP_MOE_ROUTE's src2 (experts      \
        *    a row uses), lmh_backend_api.tensor_quant_write and tensor_quant without parts;       \
        * 12: lmh_backend_opts.params (a backend's options), debug.h (LMHOST_DEBUG and             \
        *    lmh_kv_next);                                                                         \
        * 13: tool-call format plugins (LMH_KIND_TOOLCALL, toolcall.h),                      \
        *    lmh_backend_api.device_memory, lmh_cache_api.kv_bits */

/* Every plugin exports this symbol (C linkage, default visibility). */
#define LMH_PLUGIN_ENTRY_NAME "lmhost_plugin_entry"

#if defined(__GNUC__)
#define LMH_EXPORT __attribute__((visibility("default")))
#else
#define LMH_EXPORT
#endif

/* Return codes: 0 is success, negatives are errors. */
enum {
    LMH_OK = 0,
    LMH_EINVAL = -1,       /* bad argument or value */
    LMH_ENOTFOUND = -2,    /* a key, tensor or sequence is missing */
    LMH_ENOMEM = -3,       /* out of (host or device) memory */
    LMH_EUNSUPPORTED = -4, /* op, dtype or feature not supported here */
    LMH_ESHAPE = -5,       /* a tensor has the wrong shape */
    LMH_ETYPE = -6,        /* a value has the wrong type */
    LMH_EIO = -7,          /* reading a file or device failed */
    LMH_EINTERNAL = -8,
};

/* Element types. Values are stable across minor versions. */
typedef enum lmh_dtype {
    LMH_F32 = 0,
    LMH_F16 = 1,
    LMH_BF16 = 2,
    LMH_I32 = 3,
    LMH_U32 = 4,
    LMH_U8 = 5,
    LMH_I8 = 6,
    /* MLX affine-quantized weights, `bits` per value (LMH_Q2 .. LMH_Q8): each row of the
     * logical [.., out, in] matrix is an LSB-first bit stream of codes q packed in
     * little-endian uint32 words, and every `group` consecutive values of a row (the
     * tensor's `group` member) share a scale s and bias b: w = s * q + b. Made only by a
     * backend's tensor_quant (backend.h); lmh_dtype_size is 0 for them (a value has no
     * whole byte size): use lmh_dtype_is_quant / lmh_quant_bits. */
    LMH_Q2 = 7,
    LMH_Q3 = 8,
    LMH_Q4 = 9,
    LMH_Q5 = 10,
    LMH_Q6 = 11,
    LMH_Q8 = 12,
    /* (ABI 1.10) Microscaled 4-bit floats (OCP MXFP4): each row of the logical [.., out, in]
     * matrix is blocks of `group` = 32 values, a block 16 bytes of e2m1 codes (sign, 2-bit
     * exponent, 1-bit mantissa: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6), two a byte, the even
     * value in the low nibble, and one e8m0 scale byte s (2^(s - 127)): w = e2m1 * 2^(s - 127).
     * Made only by tensor_quant; lmh_dtype_size is 0, lmh_quant_bits 0 (it is not MLX
     * affine): use lmh_dtype_is_mxfp4, or lmh_dtype_is_packed for every made-only kind. */
    LMH_MXFP4 = 13,
    LMH_DTYPE_COUNT
} lmh_dtype;

#define LMH_MAX_DIMS 4

/* A tensor in some backend's memory. The header below is public so that shapes can be
 * read anywhere; the data is not: only the owning backend touches it (a GPU backend's
 * memory is not addressable by the host). Shapes are row-major like NumPy and
 * safetensors: ne[ndim-1] is the innermost, contiguous dimension. */
typedef struct lmh_tensor {
    lmh_dtype dtype;
    int32_t ndim;
    int64_t ne[LMH_MAX_DIMS];
    void *backend_priv; /* owned by the backend that made the tensor */
    int32_t group;      /* quantized dtypes: values per scale/bias group (32, 64, 128); else 0 */
} lmh_tensor;

static inline int64_t lmh_nelem(const lmh_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->ne[i];
    return n;
}

static inline size_t lmh_dtype_size(lmh_dtype d) {
    switch (d) {
    case LMH_F32:
    case LMH_I32:
    case LMH_U32:
        return 4;
    case LMH_F16:
    case LMH_BF16:
        return 2;
    case LMH_U8:
    case LMH_I8:
        return 1;
    default:
        return 0;
    }
}

static inline const char *lmh_dtype_name(lmh_dtype d) {
    static const char *const names[] = {"f32", "f16", "bf16", "i32", "u32", "u8", "i8",
                                        "q2",  "q3",  "q4",   "q5",  "q6",  "q8", "mxfp4"};
    return (unsigned)d < LMH_DTYPE_COUNT ? names[d] : "?";
}

static inline int lmh_dtype_is_quant(lmh_dtype d) {
    return d >= LMH_Q2 && d <= LMH_Q8;
}
/* (ABI 1.10) Microscaled 4-bit weights (LMH_MXFP4). */
static inline int lmh_dtype_is_mxfp4(lmh_dtype d) {
    return d == LMH_MXFP4;
}
/* (ABI 1.10) Weights only tensor_quant makes, with no whole byte size a value: MLX
 * affine (lmh_dtype_is_quant) or microscaled (lmh_dtype_is_mxfp4). */
static inline int lmh_dtype_is_packed(lmh_dtype d) {
    return lmh_dtype_is_quant(d) || lmh_dtype_is_mxfp4(d);
}
static inline int lmh_dtype_is_float(lmh_dtype d) {
    return d == LMH_F32 || d == LMH_F16 || d == LMH_BF16;
}
/* The innermost (fastest-varying) dimension: row length. */
static inline int64_t lmh_inner(const lmh_tensor *t) {
    return t->ne[t->ndim - 1];
}

/* Bits per value of a quantized dtype; 0 for the others. */
static inline int lmh_quant_bits(lmh_dtype d) {
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    return lmh_dtype_is_quant(d) ? bits[d - LMH_Q2] : 0;
}

/* The quantized dtype of `bits` (2, 3, 4, 5, 6, 8); LMH_DTYPE_COUNT for other values. */
static inline lmh_dtype lmh_quant_dtype(int bits) {
    switch (bits) {
    case 2:
        return LMH_Q2;
    case 3:
        return LMH_Q3;
    case 4:
        return LMH_Q4;
    case 5:
        return LMH_Q5;
    case 6:
        return LMH_Q6;
    case 8:
        return LMH_Q8;
    default:
        return LMH_DTYPE_COUNT;
    }
}

typedef enum lmh_plugin_kind {
    LMH_KIND_ARCH = 1,     /* a model family: models/<family>/ */
    LMH_KIND_BACKEND = 2,  /* a compute device: backends/<name>/ */
    LMH_KIND_CACHE = 3,    /* a K/V (and state) storage format: plugins/cache-<name>/ */
    LMH_KIND_TOOLCALL = 4, /* (ABI 1.13) how models write tool calls: plugins/toolcall-<name>/ */
} lmh_plugin_kind;

typedef struct lmh_host_api lmh_host_api;
struct lmh_op;
struct lmh_attn_params;
struct lmh_layer_state;
struct lmh_recurrent_state;

/* What lmhost_plugin_entry() returns. The first three members never move, so the host
 * can check the version of any plugin before reading anything else. */
typedef struct lmh_plugin_info {
    uint32_t abi_major; /* LMH_ABI_MAJOR the plugin was built with */
    uint32_t abi_minor; /* LMH_ABI_MINOR the plugin was built with */
    uint32_t size;      /* sizeof(lmh_plugin_info) as the plugin knows it */
    lmh_plugin_kind kind;
    const char *name;    /* short, unique per kind: "cpu", "plain", "llama" */
    const char *version; /* the plugin's own version string */
    const char *summary; /* one line for `lmhost plugins` */
    /* Called once after loading, before the table is used; non-zero refuses the plugin
     * (e.g. the CPU lacks an instruction set it needs). May be NULL. */
    int (*init)(const lmh_host_api *host, char *err, size_t err_len);
    /* Kind-specific table: lmh_arch_api, lmh_backend_api, lmh_cache_api or
     * lmh_toolcall_api. */
    const void *api;
} lmh_plugin_info;

typedef const lmh_plugin_info *(*lmh_plugin_entry_fn)(void);

/* Fills *info's first three members the same way in every plugin. */
#define LMH_PLUGIN_HEADER LMH_ABI_MAJOR, LMH_ABI_MINOR, (uint32_t)sizeof(lmh_plugin_info)

/* ---- Services the host offers to plugins ------------------------------------------ */

enum { LMH_LOG_ERROR = 0, LMH_LOG_WARN = 1, LMH_LOG_INFO = 2, LMH_LOG_DEBUG = 3 };

/* A model being loaded (config.json and weights): see arch.h. */
typedef struct lmh_load_ctx lmh_load_ctx;
/* One forward pass being built: see arch.h. */
typedef struct lmh_fwd lmh_fwd;

/* Where a rope op gets its frequencies from: the host reads rope settings from
 * config.json in both the legacy (rope_theta/rope_scaling) and the newer
 * rope_parameters forms, and computes the per-pair inverse frequencies. */
typedef struct lmh_rope_info {
    float attn_factor; /* multiply cos/sin by this (YaRN mscale); 1 otherwise */
    int32_t n_pairs;   /* rotary_dims / 2 entries written to inv_freq */
} lmh_rope_info;

/* For a quantized checkpoint tensor (X.weight with X.scales and X.biases beside it) the
 * logical shape ([out, in] or [E, out, in], in = packed words * 32 / bits) and its
 * quantized dtype, which is what weight() returns. */
typedef struct lmh_weight_info {
    lmh_dtype dtype;
    int32_t ndim;
    int64_t ne[LMH_MAX_DIMS];
} lmh_weight_info;

struct lmh_host_api {
    uint32_t size; /* sizeof(lmh_host_api) as the host knows it */
    uint32_t abi_minor;

    void (*log)(int level, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 2, 3)))
#endif
        ;

    /* ---- while loading (arch load()) ---- */

    /* Records why loading failed; the host shows it to the user. Returns LMH_EINVAL so
     * a plugin can `return host->fail(ld, ...)`. */
    int (*fail)(lmh_load_ctx *ld, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 2, 3)))
#endif
        ;

    /* config.json lookups by dotted path ("text_config.hidden_size", "layer_types.3").
     * Return LMH_OK, LMH_ENOTFOUND (absent or null) or LMH_ETYPE. Integers are accepted
     * where floats are asked for; bools only as bools. */
    int (*cfg_int)(lmh_load_ctx *ld, const char *path, int64_t *out);
    int (*cfg_float)(lmh_load_ctx *ld, const char *path, double *out);
    int (*cfg_bool)(lmh_load_ctx *ld, const char *path, int *out);
    /* The string stays valid until load() returns. */
    int (*cfg_str)(lmh_load_ctx *ld, const char *path, const char **out);
    /* Length of an array; LMH_ETYPE if the value is not an array. */
    int (*cfg_len)(lmh_load_ctx *ld, const char *path, int64_t *out);

    /* Rope inverse frequencies for a rotary width of rot_dims. `layer_type` selects a
     * per-layer-type entry where the config has one (rope_parameters keyed by
     * "sliding_attention"/"full_attention", or the legacy rope_local_base_freq); NULL
     * for the model-wide one. Multimodal checkpoints' text_config is read where the
     * settings sit there. Computes default, linear, yarn and proportional; other types are
     * an error here, for the plugin that knows them to compute (see rope_setting). inv_freq must
     * hold rot_dims/2 floats. Errors (unknown rope_type, bad values) go through fail(). */
    int (*rope_freqs)(lmh_load_ctx *ld, const char *layer_type, int32_t rot_dims, float *inv_freq,
                      lmh_rope_info *info);

    /* The rope settings behind rope_freqs, for plugins that compute a rope type the host
     * does not know: rope_type ("default" when none) and any number of the same parameter
     * object ("factor", ..., and "rope_theta" always). rope_setting returns LMH_OK,
     * LMH_ENOTFOUND or LMH_ETYPE. */
    int (*rope_type)(lmh_load_ctx *ld, const char *layer_type, const char **out);
    int (*rope_setting)(lmh_load_ctx *ld, const char *layer_type, const char *key, double *out);

    /* Declares the model before asking for weights: layer count and vocabulary. */
    int (*declare_model)(lmh_load_ctx *ld, int32_t n_layers, int32_t vocab_size);
    /* Declares what state layer `layer` keeps between steps (see arch.h). */
    int (*declare_layer)(lmh_load_ctx *ld, int32_t layer, const struct lmh_layer_state *st);

    /* Looks a checkpoint tensor up without loading it. LMH_ENOTFOUND if absent. */
    int (*weight_info)(lmh_load_ctx *ld, const char *name, lmh_weight_info *out);
    /* Loads checkpoint tensor `name` onto the backend that runs `layer` (or
     * LMH_LAYER_INPUT / LMH_LAYER_OUTPUT) and returns it. When ndim > 0 its shape must
     * equal ne[0..ndim-1] (the host reports a mismatch naming both shapes); ndim = 0
     * accepts any shape. Returns NULL after calling fail() (missing tensor, shape). The
     * host owns the tensor and frees it with the model. An MLX-quantized weight (config.json
     * "quantization", X.scales/X.biases beside X.weight) comes back as a quantized tensor
     * (LMH_Q2..LMH_Q8) of the logical shape; matmul, get_rows and moe_matmul take it.
     * (ABI 1.10) So does a microscaled 4-bit one: name X stored as X_blocks (u8
     * [.., out, in / 32, 16]) and X_scales (u8 [.., out, in / 32]) with config.json
     * "quantization_config": {"quant_method": "mxfp4"} comes back as LMH_MXFP4
     * [.., out, in], and weight_info reports that dtype and shape. */
    lmh_tensor *(*weight)(lmh_load_ctx *ld, int32_t layer, const char *name, int32_t ndim,
                          const int64_t *ne);
    /* Loads `count` checkpoint tensors named by printf(fmt, i) for i in 0..count-1, each
     * of shape ne[0..ndim-1], as one tensor [count, ne...] on the backend of `layer`:
     * per-expert weights become the stacked layout expert ops take. NULL after fail(). */
    lmh_tensor *(*weight_stack)(lmh_load_ctx *ld, int32_t layer, const char *fmt, int32_t count,
                                int32_t ndim, const int64_t *ne);
    /* A tensor made from plugin-computed host data (e.g. rope tables), copied to the
     * backend of `layer`. The host owns and frees it with the model. */
    lmh_tensor *(*constant)(lmh_load_ctx *ld, int32_t layer, lmh_dtype dtype, int32_t ndim,
                            const int64_t *ne, const void *data);

    /* ---- while running a forward pass (arch forward()) ---- */

    /* A scratch tensor on the backend of `layer`, freed when the pass ends. */
    lmh_tensor *(*fwd_tensor)(lmh_fwd *f, int32_t layer, lmh_dtype dtype, int32_t ndim,
                              const int64_t *ne);
    /* Another shape over the same (contiguous) elements, starting `offset` elements in.
     * Freed when the pass ends. */
    lmh_tensor *(*fwd_view)(lmh_fwd *f, lmh_tensor *t, int64_t offset, int32_t ndim,
                            const int64_t *ne);
    /* Enqueues one op (backend.h) on the backend of `layer`. */
    int (*fwd_op)(lmh_fwd *f, int32_t layer, const struct lmh_op *op);
    /* Stores this pass's k, v rows ([rows, kv_heads, head_dim]) in the layer's cache and
     * writes attention of q ([rows, heads, head_dim]) over each row's sequence into out
     * ([rows, heads, head_dim_v]). The cache plugin chosen for the request does both. */
    int (*fwd_attention)(lmh_fwd *f, int32_t layer, lmh_tensor *q, lmh_tensor *k, lmh_tensor *v,
                         lmh_tensor *out, const struct lmh_attn_params *p);

    /* ---- (ABI 1.7) recurrent state: check abi_minor >= 7 (or size) before calling ---- */

    /* Declares the recurrent state layer `layer` keeps per sequence (arch.h), beside or
     * instead of what declare_layer said: a layer may have both (attention and a state
     * space mixer side by side). */
    int (*declare_recurrent)(lmh_load_ctx *ld, int32_t layer, const struct lmh_recurrent_state *st);
    /* Enqueues a recurrent op (ops.h: CONV1D, SSM_SCAN, SSD_SCAN, DELTA_RULE) over the
     * pass's rows, its state operand left NULL: each sequence's rows run with that
     * sequence's state buffer `buf` of `layer` (the cache plugin's), in order, and leave
     * it updated. Rows of the op's row operands and dst are the pass's rows. */
    int (*fwd_recurrent)(lmh_fwd *f, int32_t layer, int32_t buf, const struct lmh_op *op);

    /* (ABI 1.10) check abi_minor >= 10 (or size) before calling. Like weight(), for a
     * float (f32, f16, bf16) checkpoint tensor stored input-major, [.., in, out] (fused
     * experts saved as [E, in, out]): it comes back with its last two dimensions swapped,
     * [.., out, in], the layout matmul and moe_matmul take; ne (ndim > 0) is that swapped
     * shape. Any other dtype, MLX-quantized included, is an error (fail()). */
    lmh_tensor *(*weight_transposed)(lmh_load_ctx *ld, int32_t layer, const char *name,
                                     int32_t ndim, const int64_t *ne);

    /* (ABI 1.11) check abi_minor >= 11 (or size) before calling. Declares a mixture of
     * experts: n_experts stacked experts per MoE layer, top_k of them a token. Called before
     * the experts' weights are asked for, it lets the host stream them from disk
     * (`--stream-experts`: 3-D weights [n_experts, out, in] then stay on disk, and only the
     * experts the router picks are read, which the host does inside LMH_OP_MOE_MATMUL; such a
     * weight may only be that op's src1). It also says that forward() honours
     * lmh_batch.moe_top_k (arch.h); a plugin that cannot must not call it. */
    int (*declare_moe)(lmh_load_ctx *ld, int32_t n_experts, int32_t top_k);
};

/* Pseudo layer indices for placement of tensors outside the layer stack. */
#define LMH_LAYER_INPUT  (-1) /* embeddings, per-layer inputs */
#define LMH_LAYER_OUTPUT (-2) /* final norm, lm_head */

#ifdef __cplusplus
}
#endif
#endif
