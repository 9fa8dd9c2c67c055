/* The Vulkan backend's internals, shared by vk_backend.c (device, memory, command
 * recording) and vk_ops.c (operand checks and one recording function per op). */
#ifndef LMHOST_VULKAN_BACKEND_H
#define LMHOST_VULKAN_BACKEND_H

#include "lmhost/lmhost.h"

#include <pthread.h>
#include <vulkan/vulkan.h>

/* Descriptor bindings of every pipeline: 0 dst, 1..4 src0..src3, 5 and 6 the backend's
 * own buffers (attention partials, MoE work lists, MoE statistics); 5..8 also src4..src7
 * of the recurrent ops (ABI 1.7), whose shaders get their element offsets in push constant
 * words 5..8. */
#define VK_NBIND          9
#define VK_PC_WORDS       32 /* 128 bytes, the push constant size every device offers */
#define VK_NSPEC          11
#define VK_ATTN_CNT_SLOTS 16 /* sets of attention's split counters (vk_backend.c) */
#define VK_NBATCH         3
#define VK_NREAD          4  /* downloads started and not yet waited for */
#define MATVEC_WG         64 /* matrix-vector workgroup: threads (vk-matvec overrides) */
#define MATVEC_NR         2  /* and output columns */
#define QMATVEC_NR        4  /* quantized: output columns a workgroup (best of 4, 8, 16: H200) */
/* one row (decode): with the fused norm or SwiGLU each workgroup's share of the row costs
 * more, and 128 threads beat 64 (README, H100) */
#define MATVEC1_WG 128

typedef struct vk_block vk_block;

/* One suballocation of a block; views share their base's. */
typedef struct vk_alloc {
    vk_block *blk;
    VkDeviceSize off, size;
    uint64_t last_use; /* serial of the last batch that recorded work on it */
    uint64_t gen;      /* changed by every write recorded on it (vk_cols_index_ok's cache) */
    int weight;
} vk_alloc;

typedef struct vk_tensor {
    lmh_tensor t; /* first: a vk_tensor* is an lmh_tensor* */
    vk_alloc *a;
    VkDeviceSize off; /* byte offset of the data in a->blk->buf */
    VkDeviceSize bytes;
    int owned;
    /* Quantized weights (tensor_quant): one allocation holding the packed codes (rows of
     * wpr words), then the scales and the biases (gpr values a row, dtype q_sdt), each
     * part starting on 16 bytes; q_scales/q_biases are their word offsets from off. */
    uint32_t q_bits, q_wpr, q_gpr, q_sdt;
    uint32_t q_scales, q_biases;
    int q_write; /* (ABI 1.11) made without parts: rows come by tensor_quant_write */
} vk_tensor;

#define VT(x) ((vk_tensor *)(x))

enum vk_shader {
    VK_SH_ELTWISE,
    VK_SH_COPY,
    VK_SH_GET_ROWS,
    VK_SH_TRANSPOSE,
    VK_SH_RMS_NORM,
    VK_SH_RMS_NORM_ADD,
    VK_SH_RMS_NORM_ROPE,
    VK_SH_MATVEC1,
    VK_SH_QMATVEC1,
    VK_SH_MATVEC1_FX, /* the one-row products with fused neighbours (fused.glsl) */
    VK_SH_QMATVEC1_FX,
    VK_SH_ROPE,
    VK_SH_MATVEC,
    VK_SH_MATVEC8, /* several rows, 8 at a time (batched decode, short prefill chunks) */
    VK_SH_MATMUL,
    VK_SH_MATVEC_MOE,
    VK_SH_MATMUL_MOE,
    VK_SH_ATTENTION,
    VK_SH_ATTN_DECODE,      /* few queries over many keys (attn_decode.comp) */
    VK_SH_ATTN_DECODE_SEQS, /* the same for several sequences a dispatch (SEQS) */
    VK_SH_COPY_SEQS,        /* copies of several tensors a dispatch (copy_seqs.comp) */
    VK_SH_MOE_ROUTE,
    VK_SH_MOE_SORT,
    VK_SH_MOE_COMBINE,
    VK_SH_QMATVEC, /* quantized weights (MLX affine): qmatvec.comp, qmatmul.comp */
    VK_SH_QMATVEC8,
    VK_SH_QMATMUL,
    VK_SH_QMATVEC_MOE,
    VK_SH_QMATMUL_MOE,
    VK_SH_QGET_ROWS,
    VK_SH_MATMUL_COOP,  /* prefill on matrix cores (VK_NV_cooperative_matrix) */
    VK_SH_QMATMUL_COOP, /* the same with MLX-quantized weights */
    VK_SH_ATTN_COOP,    /* and its attention */
    VK_SH_BW_READ,      /* the memory read bandwidth probe */
    VK_SH_ARGMAX,
    VK_SH_MATMUL_BIG,  /* prefill: f32 tiles of 128 outputs x 64 or 128 rows (matmul_big.comp) */
    VK_SH_QMATMUL_BIG, /* the same with MLX-quantized weights */
    VK_SH_SPLIT_SUM,   /* the splits of a product split over k added (split_sum.comp) */
    VK_SH_FMA_PEAK,    /* the multiply-add rate probes: f32 FMA, */
    VK_SH_COOP_PEAK,   /* and the matrix cores */
    /* ABI 1.7: column splits and the recurrent ops (vk_ops.c: op_cols, op_conv1d, op_scan,
     * op_ssd_chunked, op_delta, op_delta_chunked) */
    VK_SH_COLS,
    VK_SH_CONV1D,
    VK_SH_SCAN,       /* Mamba-1 and Mamba-2 scans, row by row (scan.comp) */
    VK_SH_SSD_STATES, /* Mamba-2 chunked: each chunk's own state (ssd_chunk.comp), */
    VK_SH_SSD_PASS,   /* the states passed from chunk to chunk, */
    VK_SH_SSD_OUT,    /* and the outputs */
    VK_SH_DELTA,      /* gated delta rule, row by row (delta.comp) */
    VK_SH_DELTA_PREP, /* chunked: each chunk's WY/UT form (delta_chunk.comp), */
    VK_SH_DELTA_SEQ,  /* and the chunks in order */
    /* ABI 1.10: a rope with two tables, chosen per row (rope.comp built with SWITCH) */
    VK_SH_ROPE_SWITCH,
    VK_SH_PLUGIN, /* another plugin's kernel (kernel_add): vk_dispatch.pipe */
    VK_SH_COUNT
};

/* One dispatch to record. pc[0..4] are filled in by vk_record with the element offsets
 * of bindings 0..4 within their bound (aligned) range. */
/* A plugin's kernel made ready here (kernel_add): its pipeline on the backend's layout */
struct lmh_kernel {
    const lmh_kernel_desc *desc;
    VkShaderModule module;
    VkPipeline pipe;
    char name[64];  /* the desc's, copied: the plugin that owns it may go first */
    double prof_us; /* option profile=1|2: its dispatches' GPU time */
    uint64_t prof_n;
    struct lmh_kernel *next;
};

typedef struct vk_dispatch {
    enum vk_shader shader;
    uint32_t spec[VK_NSPEC]; /* specialization constants 0..VK_NSPEC-1 */
    const vk_tensor *bind[VK_NBIND];
    uint32_t writes; /* bit i: binding i is written */
    uint32_t pc[VK_PC_WORDS];
    uint32_t pc_words;
    uint32_t groups[3];
    const vk_tensor *indirect; /* dispatch with arguments read from the start of this */
    /* tensors the shader reaches by device address, read and written (hazards, lifetime) */
    const vk_tensor *const *xrd, *const *xwr;
    int nxrd, nxwr;
    VkPipeline pipe;           /* VK_SH_PLUGIN: the plugin kernel's pipeline */
    struct lmh_kernel *kernel; /* and the kernel, for its profile */
} vk_dispatch;

typedef struct vk_hostbuf {
    VkBuffer buf;
    VkDeviceMemory mem;
    void *map;
    VkDeviceSize size;
} vk_hostbuf;

typedef struct vk_moe_stat {
    uint32_t slot;
    uint64_t bytes_per_expert; /* 0 when the weights are not counted */
} vk_moe_stat;

/* option profile=3: a step is what runs between two barriers (or a batch's ends); it is
 * known by its first dispatches, whether a full barrier began it, and its copies */
#define STEP_NAMED 4
typedef struct vk_step {
    uint32_t groups[STEP_NAMED];
    uint8_t shader[STEP_NAMED];
    uint8_t heavy, copies, n; /* n: dispatches, STEP_NAMED of them named */
    uint8_t zero;             /* no padding: steps are compared with memcmp */
} vk_step;

typedef struct vk_step_time {
    vk_step s;
    double us;
    uint64_t n;
} vk_step_time;

typedef struct vk_batch {
    VkCommandBuffer cb;
    VkFence fence;
    int state; /* 0 idle, 1 recording, 2 submitted */
    uint64_t serial;
    uint32_t ndispatch;
    VkQueryPool queries; /* option profile: a timestamp pair per dispatch */
    uint32_t nqueries;
    uint8_t *query_shader;
    uint32_t *query_groups;           /* the dispatch's workgroups (option profile=2) */
    struct lmh_kernel **query_kernel; /* a plugin kernel's dispatch: the kernel */
    vk_step *steps;                   /* option profile=3: the step each timestamp ends */
    VkDescriptorPool *pools;
    int npools, pool_sets; /* sets taken from pools[npools - 1] */
    vk_hostbuf staging;
    VkDeviceSize staging_used;
    vk_block *stats; /* host-visible slots written by moe_sort */
    vk_tensor *stats_t;
    vk_moe_stat *moe;
    int nmoe, capmoe;
    vk_block *args; /* host-visible tables the batch's dispatches read (vk_args) */
    vk_alloc *args_a;
    VkDeviceSize args_used;
} vk_batch;

typedef struct vk_range {
    const vk_block *blk;
    VkDeviceSize lo, hi;
} vk_range;

/* An op held by vk_fuse.c to run with the next sequences' (one dispatch: decode attention,
 * cache appends), with copies of its tensors (dst, src0..src3 where it has them, then an
 * attention's sinks). */
#define VK_SEQ_KEY (1 + VK_NSPEC + 8 + 4) /* words of vk_seq_key's key (4: the sinks) */
typedef struct vk_held_seq {
    lmh_op op;
    vk_tensor t[6];
    uint32_t key[VK_SEQ_KEY];
} vk_held_seq;

/* An op put off by vk_fuse.c, with copies of its tensors (dst, src0, src1): the op's own
 * may be views that are freed before it is recorded. */
typedef struct vk_virt {
    lmh_op op;
    vk_tensor t[3];
    int done; /* its result is in its dst, or will be by the next recorded dispatch */
} vk_virt;
#define VK_NVIRT 4

typedef struct vk_pipe {
    enum vk_shader shader;
    uint32_t spec[VK_NSPEC];
    VkPipeline p;
} vk_pipe;

struct lmh_backend {
    pthread_mutex_t mu;
    const lmh_host_api *host;
    VkInstance inst;
    VkPhysicalDevice pd;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties mem;
    int subgroup_arith; /* subgroupAdd in compute shaders */
    int32_t precision;  /* LMH_PRECISION_EXACT or _FAST (0 until the device is known) */
    int coopmat;        /* VK_NV_cooperative_matrix 16x16x16 f16 -> f32, subgroups of 32 */
    int attn_coop;      /* and subgroup arithmetic, shuffles and votes: attn_coop.comp */
    uint32_t subgroup_size;
    VkDeviceSize align;        /* offset alignment of storage buffer bindings (>= 16) */
    VkDeviceSize max_range;    /* maxStorageBufferRange */
    VkDeviceSize max_alloc;    /* maxMemoryAllocationSize */
    uint32_t max_shared;       /* maxComputeSharedMemorySize */
    uint32_t kernel_shared;    /* of which plugin kernels may use (vk-kernel-shared) */
    uint32_t kernel_grid_x;    /* a plugin kernel's workgroups a grid row (vk-kernel-grid-x) */
    uint32_t attn_target_wgs;  /* workgroups to aim for when splitting attention keys */
    uint32_t attn_ku, attn_vu; /* attention.comp's KU (at most) and VU */
    /* attn_decode.comp: lanes per key at most (0: not used; it needs subgroup shuffles)
     * and keys a key group loads together */
    uint32_t attn_dec_tpk, attn_dec_ku;
    uint32_t attn_dec_wgs; /* workgroups its key splits aim for */
    char desc[400];

    vk_block **blocks;
    int nblocks, capblocks;

    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkShaderModule modules[VK_SH_COUNT];
    struct lmh_kernel *kernels; /* plugin kernels made ready here (kernel_add) */
    vk_pipe *pipes;
    int npipes, cappipes;

    VkCommandPool cmdpool;
    vk_batch batch[VK_NBATCH];
    int cur;         /* recording batch, -1 when none */
    int last;        /* batch most recently begun */
    uint64_t serial; /* last serial handed out */
    uint64_t done;   /* every batch with a serial <= done has completed */

    /* ranges read and written since the last barrier */
    vk_range *rd, *wr;
    int nrd, nwr, caprd, capwr;
    int xfer_since_barrier; /* a copy or an indirect dispatch among them */
    int compute_only_since; /* the last barrier was compute-only */
    int full_barriers;      /* LMHOST_DEBUG vk-full-barriers: every barrier takes all stages */

    /* owned allocations freed once the batch that last used them completes */
    vk_alloc **defer;
    int ndefer, capdefer;

    vk_hostbuf readback;
    /* downloads in flight (download_start): each copies into its own host memory */
    struct vk_read {
        vk_hostbuf buf;
        uint64_t ticket; /* 0: free */
        uint64_t serial; /* the batch that holds the copy */
        size_t n;
    } reads[VK_NREAD];
    uint64_t last_ticket;
    vk_tensor *dummy;    /* bound where a pipeline has no tensor */
    vk_tensor *attn_cnt; /* attention's split counters: attn_target_wgs words, zero at rest */
    vk_tensor *attn_slot[VK_ATTN_CNT_SLOTS]; /* attn_cnt in as many sets, taken in turn */
    uint32_t attn_next;                      /* the set the next attention takes */
    /* split products' sums (vk_ops.c's split_room): buffers kept and taken in turn */
#define VK_SPLIT_SLOTS 4
    vk_tensor *split_room[VK_SPLIT_SLOTS];
    uint32_t split_next;
    vk_tensor *scan_room; /* the chunked scans' scratch, grown to the most asked */
    /* the chunked forms of SSD_SCAN and DELTA_RULE from this many rows (LMHOST_DEBUG vk-scan-chunk;
     * 0: never) */
    uint32_t scan_chunk;
    uint32_t scan_seg; /* and their chunks a pass at most (0: as the scratch allows) */
    uint64_t gen_next; /* vk_alloc.gen's source */
    /* COLS gathers' index tensors already read back (vk_cols_index_ok): the allocation and
     * generation they were read at, and their least and largest index */
#define VK_COLS_CACHE 16
    struct vk_cols_seen {
        const vk_alloc *a;
        uint64_t gen;
        VkDeviceSize off, bytes;
        int32_t lo, hi;
    } cols_seen[VK_COLS_CACHE];
    uint32_t cols_next;

    uint64_t weight_bytes, other_bytes, weight_read;
    int err;                            /* sticky: after a lost device every call fails */
    VkDebugUtilsMessengerEXT messenger; /* LMHOST_DEBUG vk-validate */
    int validation_errors;
    /* VK_KHR_push_descriptor: bindings go into the command buffer, no sets to allocate */
    PFN_vkCmdPushDescriptorSetKHR push_set;
    int profile;    /* option profile=1: GPU time per shader, logged at destroy (2, 3: below) */
    int pipe_stats; /* profiling, and the driver reports each pipeline's registers and the like */
    double prof_us[VK_SH_COUNT];
    uint64_t prof_n[VK_SH_COUNT];
    double prof_record_s, prof_wait_s; /* host time recording dispatches, waiting on fences */
    uint64_t prof_submits;
    /* option profile=2: GPU time per (shader, workgroup count), the first ones seen */
#define PROF_SHAPES 64
    struct {
        int shader;
        uint32_t groups;
        double us;
        uint64_t n;
    } prof_shape[PROF_SHAPES];
    int nprof_shape;
    /* option profile=3: GPU time per kind of step (the first ones seen), and the step
     * being recorded */
#define PROF_STEPS 128
    vk_step_time prof_step[PROF_STEPS];
    int nprof_step;
    vk_step step_cur;
    uint64_t prof_last_end, prof_gaps; /* the last batch's end (timestamp), idle gaps */
    double prof_gap_us;
    /* a batch of at least this many dispatches is submitted as soon as the device is idle */
    int submit_min;
    uint32_t spin_us; /* a wait polls its fence this long before it sleeps (option spin) */
    /* the backend's options (lmh_backend_opts.params): the device memory it takes at most
     * (max-memory; 0: as the driver allows), and profile and spin as given (-1: the
     * device's default) */
    VkDeviceSize max_memory;
    int opt_profile;
    long opt_spin;
    uint32_t argmax_wg;  /* argmax.comp's workgroup: as wide as the device allows, up to 1024 */
    uint32_t matmul_big; /* matmul_big.comp for products of at least this many rows (0: never) */
    uint32_t matmul_tm;  /* and its rows a thread (0: by the product's shape) */
    /* vk_fuse.c: an op held back to be fused with the next one (with the put-off op its
     * product computes on the fly, and whether it stores that op's result), and the ops
     * put off */
    lmh_op held, held_rope; /* held_rope: the rope after a held norm, with held_has_rope */
    int has_held, held_has_rope;
    vk_virt held_pro;
    int held_has_pro, held_write_pro;
    vk_virt virt[VK_NVIRT];
    int nvirt;
    int held_err; /* recording failed: the next call that returns a status says so */
    int no_fuse;  /* LMHOST_DEBUG vk-no-fuse */
    /* one-row norms and SwiGLU put off into the products reading them (vk-fuse-products,
     * default on but for CPU devices) */
    int fuse_products;
    /* decode attentions (attn_decode.comp with SEQS) and copies (copy_seqs.comp) held to run
     * as one dispatch, where the device gives shaders buffer addresses, from seq_attn of
     * them (0: never) */
    uint32_t seq_attn;
    uint32_t attn_seq_wgs; /* workgroups such a dispatch aims for (vk-attn-seq-wgs) */
    vk_held_seq *hseq;
    int nhseq, caphseq;
    vk_range *hrng[5]; /* their tensors by operand, merged (vk_fuse.c), caphseq each */
    int nhrng[5];
    /* matrix-vector workgroup: threads and output columns (LMHOST_DEBUG vk-matvec=WGxNR) */
    uint32_t matvec_wg, matvec_nr, matvec1_wg; /* matvec1_wg: one-row products */
    uint32_t matvec_rows; /* rows up to which products are matrix-vector ones */
    uint32_t matvec8_nr;  /* output columns a workgroup of the 8-row variant */
};

/* vk_backend.c */
void vk_log(lmh_backend *b, int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int vk_record(lmh_backend *b, const vk_dispatch *d);
/* d's grid for `groups` workgroups: rows of at most row_max past that many (vk_ops.c) */
void vk_grid(vk_dispatch *d, uint64_t groups, uint32_t row_max);
/* A device buffer for the backend's own use (not counted as a tensor); free with
 * vk_tensor_release, which waits for the work recorded on it like tensor_free. */
vk_tensor *vk_scratch(lmh_backend *b, VkDeviceSize bytes);
void vk_tensor_release(lmh_backend *b, vk_tensor *t);
/* The current batch's MoE statistics tensor and a free slot in it (records the slot's
 * bytes per used expert); -1 when the batch has no slot left. */
int vk_moe_slot(lmh_backend *b, uint64_t bytes_per_expert, const vk_tensor **stats);
/* Whether a tensor can be bound whole (maxStorageBufferRange). */
int vk_bindable(const lmh_backend *b, const lmh_tensor *t);
/* The element offset a shader gets for t bound at binding 5 or 6 (vk_record fills in
 * those of bindings 0..4). */
uint32_t vk_elem_off(const lmh_backend *b, const vk_tensor *t);
/* n bytes of the current batch's host-visible table memory, for a dispatch of that batch
 * to read (bound like a tensor; released with vk_tensor_release), written through *map;
 * NULL where it cannot be had. */
vk_tensor *vk_args(lmh_backend *b, size_t n, void **map);
/* The device address of t's first byte (0 where its block has none). */
VkDeviceAddress vk_addr(const vk_tensor *t);
/* n bytes of t from `off` read back into dst, after every op enqueued so far has run (the
 * backend's lock held). */
int vk_read_locked(lmh_backend *b, const vk_tensor *t, size_t off, void *dst, size_t n);

/* vk_ops.c */
int vk_check_op(lmh_backend *b, const lmh_op *op);
int vk_enqueue_op(lmh_backend *b, const lmh_op *op);
/* vk_ops.c: one pass of the read bandwidth probe over buf (vk_read_bandwidth) */
int vk_record_read_probe(lmh_backend *b, vk_tensor *buf, vk_tensor *dst);
/* One run of the multiply-add rate probe of the products' kind (the matrix cores' where
 * matmul_coop runs): `groups` workgroups, writing nothing but perhaps a word of dst;
 * *flop gets the FLOP it does. */
int vk_record_peak_probe(lmh_backend *b, vk_tensor *dst, uint32_t groups, double *flop);
/* RMSNorm (op), with the ADD whose result it reads (add) or the ROPE in place on its
 * result (rope) in the same dispatch; op NULL: the rope alone; copy (with rope): the COPY
 * of the rope's result (a cache append) too. */
int vk_rms_norm(lmh_backend *b, const lmh_op *op, const lmh_op *add, const lmh_op *rope,
                const lmh_op *copy);
#define VK_FUSE_ROPE_MAXD 512 /* longest row of the fused norm + rope (MAXD, rms_norm.comp) */
/* A MATMUL of one row (a matrix-vector product fused.glsl can extend), and one recorded
 * with its fused neighbours: pro a RMS_NORM or SWIGLU whose result it reads (computed from
 * pro's operands; with write_pro the norm's result stored too), add the in-place ADD of
 * its result into add->dst (either may be NULL). */
int vk_matvec_fusable(const lmh_op *mm);
/* Ops of several sequences in one dispatch (decode attention, copies): whether op can be one
 * of them, with its key in key (ops of equal keys can share a dispatch: the op code, the
 * pipeline and the parameters all of them share), and the dispatches for n such ops of one
 * key (one dispatch where they fit). */
int vk_seq_key(lmh_backend *b, const lmh_op *op, uint32_t key[VK_SEQ_KEY]);
int vk_attention_seqs(lmh_backend *b, const lmh_op *ops, int n);
int vk_copy_seqs(lmh_backend *b, const lmh_op *ops, int n);
int vk_matvec_fused(lmh_backend *b, const lmh_op *mm, const lmh_op *pro, int write_pro,
                    const lmh_op *add);

/* vk_fuse.c: ops enqueued through the fusion policy (see there); the calls that must see
 * memory as the ops so far leave it: all of it (sync), t read or written (download,
 * upload), t about to be freed. vk_fuse_take_err: a failure recording a held or put-off
 * op where no status could be returned. */
int vk_fuse_enqueue(lmh_backend *b, const lmh_op *op);
void vk_fuse_flush(lmh_backend *b);
void vk_fuse_access(lmh_backend *b, const vk_tensor *t, int write);
void vk_fuse_free(lmh_backend *b, const vk_tensor *t);
int vk_fuse_take_err(lmh_backend *b);

/* vk_shaders.c */
typedef struct vk_spirv {
    const uint32_t *code, *code_sg; /* code_sg: the variant with subgroup reductions */
    size_t size, size_sg;
    const char *name;
} vk_spirv;
extern const vk_spirv vk_shaders[VK_SH_COUNT];

#endif
