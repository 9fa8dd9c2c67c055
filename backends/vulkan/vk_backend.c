/* The Vulkan backend plugin: tensors in device-local memory suballocated from large
 * blocks, ops recorded into command buffers (vk_ops.c) with a barrier only where one
 * reads or overwrites what an earlier op wrote or read, and submitted when a download
 * or sync() needs the results or a batch grows large. Uploads go through host-visible
 * staging memory in the command stream (so they are ordered with the ops); downloads
 * wait for a fence. Memory of a freed tensor is reused only once the batches that used
 * it have completed.
 *
 * Its options (lmh_backend_opts.params: `--backend vulkan:KEY=VALUE,...`, docs/tuning.md):
 * device=N picks the device (as --device does); max-memory=N[K|M|G] caps the device memory
 * it allocates (an allocation past the cap fails as VK_ERROR_OUT_OF_DEVICE_MEMORY would:
 * room left for other programs, or a smaller device tried on a larger one); profile=1 times
 * every dispatch on the GPU and logs the time per shader, and the host's time recording and
 * waiting, when the backend is destroyed (=2: per shader and workgroup count too, which
 * tells a model's products apart; =3: the time between barriers, per kind of step); spin=US
 * lets a wait poll its fence for up to US microseconds before it sleeps (default 10000 on
 * GPUs, 0 on CPU devices, whose threads a polling one would slow).
 *
 * Everything else it derives from the device: its type, subgroup sizes and operations,
 * shared memory and extensions. The switches that tests and measurements use to take other
 * paths, or a GPU's on lavapipe, are LMHOST_DEBUG keys (lmhost/debug.h), each described
 * where setup_device reads it: vk-validate, vk-no-subgroup, vk-no-push-descriptor,
 * vk-no-fuse, vk-fuse-products, vk-full-barriers, vk-submit-min, vk-matvec, vk-matvec-rows,
 * vk-matmul-big, vk-scan-chunk, vk-kernel-shared, vk-kernel-grid-x, vk-attn-unroll, vk-attn-wgs,
 * vk-attn-dec-wgs, vk-attn-decode, vk-attn-seqs and vk-attn-seq-wgs. */
#include "vk_backend.h"
#include "vk_spirv.h"

#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB          ((VkDeviceSize)1 << 20)
#define ALLOC_ALIGN  256        /* of every suballocation */
#define BLOCK_MIN    (16 * MIB) /* first block of a kind; later ones double */
#define BLOCK_MAX    (256 * MIB)
#define STAGING_SIZE (16 * MIB)   /* host-visible upload memory per batch */
#define MAX_DISPATCH 256          /* dispatches per batch before it is submitted */
#define SUBMIT_MIN   16           /* dispatches per batch before an idle device gets it */
#define SPIN_US      10000        /* how long a wait polls its fence (option spin) */
#define POOL_SETS    256          /* descriptor sets per pool */
#define MATVEC_ROWS  16           /* matrix-vector products up to this many rows on GPUs */
#define BIG_MIN_ROWS 17           /* matmul_big.comp from this many rows (vk-matmul-big) */
#define MATVEC8_NR   4            /* output columns a workgroup of the 8-row matrix-vector kernel */
#define STAT_SLOTS   1024         /* MoE statistics per batch */
#define ARGS_BYTES   (256 * 1024) /* tables for dispatches per batch (vk_args) */
#define SCAN_CHUNK   96           /* chunked scans from this many rows (vk-scan-chunk) */

struct vk_block {
    VkDeviceMemory mem;
    VkBuffer buf;
    VkDeviceSize size;
    void *map;     /* host-visible blocks only */
    int weight;    /* weights and other tensors live in separate blocks */
    int dedicated; /* made for one allocation larger than a block */
    int host;
    VkDeviceAddress addr;  /* device blocks, where shaders take addresses (b->seq_attn) */
    VkDeviceSize (*fr)[2]; /* free ranges (offset, size), sorted by offset */
    int nfr, capfr;
};

static const lmh_host_api *g_host;

void vk_log(lmh_backend *b, int level, const char *fmt, ...) {
    const lmh_host_api *h = b && b->host ? b->host : g_host;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (h && h->log)
        h->log(level, "vulkan: %s", msg);
    else if (level <= LMH_LOG_WARN)
        fprintf(stderr, "vulkan: %s\n", msg);
}

static const char *vk_result_name(VkResult r) {
#define R(x)                                                                                       \
    { x, #x }
    static const struct {
        VkResult r;
        const char *name;
    } names[] = {R(VK_SUCCESS),
                 R(VK_NOT_READY),
                 R(VK_TIMEOUT),
                 R(VK_ERROR_OUT_OF_HOST_MEMORY),
                 R(VK_ERROR_OUT_OF_DEVICE_MEMORY),
                 R(VK_ERROR_INITIALIZATION_FAILED),
                 R(VK_ERROR_DEVICE_LOST),
                 R(VK_ERROR_MEMORY_MAP_FAILED),
                 R(VK_ERROR_LAYER_NOT_PRESENT),
                 R(VK_ERROR_EXTENSION_NOT_PRESENT),
                 R(VK_ERROR_FEATURE_NOT_PRESENT),
                 R(VK_ERROR_INCOMPATIBLE_DRIVER),
                 R(VK_ERROR_TOO_MANY_OBJECTS),
                 R(VK_ERROR_OUT_OF_POOL_MEMORY)};
#undef R
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].r == r) return names[i].name;
    return "VkResult error";
}

/* Logs a failed call and maps it to an lmhost error; a lost device makes every later
 * call fail. */
static int vk_fail(lmh_backend *b, VkResult r, const char *what) {
    vk_log(b, LMH_LOG_ERROR, "%s failed: %s (%d)", what, vk_result_name(r), (int)r);
    if (r == VK_ERROR_DEVICE_LOST) {
        b->err = LMH_EIO;
        return LMH_EIO;
    }
    return r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY ? LMH_ENOMEM
                                                                                  : LMH_EIO;
}

static void *grow(void *p, int *cap, int need, size_t elem) {
    if (need <= *cap) return p;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(p, (size_t)nc * elem);
    if (q) *cap = nc;
    return q;
}

/* ---- memory ----------------------------------------------------------------------- */

static int pick_type(const lmh_backend *b, uint32_t bits, VkMemoryPropertyFlags need,
                     VkMemoryPropertyFlags want, VkMemoryPropertyFlags avoid) {
    int best = -1, best_score = 0;
    for (uint32_t i = 0; i < b->mem.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = b->mem.memoryTypes[i].propertyFlags;
        if (!(bits & (1u << i)) || (f & need) != need) continue;
        int score = 4 * __builtin_popcount(f & want) - __builtin_popcount(f & avoid);
        if (best < 0 || score > best_score) {
            best = (int)i;
            best_score = score;
        }
    }
    return best;
}

static void block_destroy(lmh_backend *b, vk_block *k) {
    if (!k) return;
    if (k->buf) vkDestroyBuffer(b->dev, k->buf, NULL);
    if (k->mem) vkFreeMemory(b->dev, k->mem, NULL);
    free(k->fr);
    free(k);
}

/* A buffer over its own memory: device-local, or host-visible (mapped) when host; host 2:
 * tables the host writes and the device reads, in device-local memory where the device has
 * it host-visible (a GPU's BAR), so that its reads stay on the device. */
static vk_block *block_new(lmh_backend *b, VkDeviceSize size, int host, int quiet) {
    vk_block *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->size = size;
    k->host = host;
    VkBufferCreateInfo bi = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = size,
        .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    int addressed = b->seq_attn && !host;
    if (addressed) bi.usage |= VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
    VkResult r = vkCreateBuffer(b->dev, &bi, NULL, &k->buf);
    if (r != VK_SUCCESS) {
        if (!quiet) vk_fail(b, r, "vkCreateBuffer");
        block_destroy(b, k);
        return NULL;
    }
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(b->dev, k->buf, &req);
    int type =
        host ? pick_type(b, req.memoryTypeBits,
                         VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                         host == 2 ? VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
                                   : VK_MEMORY_PROPERTY_HOST_CACHED_BIT,
                         0)
             : pick_type(b, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0,
                         VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
    if (type < 0 && !host) type = pick_type(b, req.memoryTypeBits, 0, 0, 0);
    if (type < 0) {
        vk_log(b, LMH_LOG_ERROR, "no suitable memory type for a %s buffer",
               host ? "host-visible" : "device");
        block_destroy(b, k);
        return NULL;
    }
    VkMemoryAllocateFlagsInfo fi = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
                                    .flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT};
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                               .pNext = addressed ? &fi : NULL,
                               .allocationSize = req.size,
                               .memoryTypeIndex = (uint32_t)type};
    r = vkAllocateMemory(b->dev, &ai, NULL, &k->mem);
    if (r == VK_SUCCESS) r = vkBindBufferMemory(b->dev, k->buf, k->mem, 0);
    if (r == VK_SUCCESS && addressed) {
        VkBufferDeviceAddressInfo di = {.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO,
                                        .buffer = k->buf};
        k->addr = vkGetBufferDeviceAddress(b->dev, &di);
    }
    if (r == VK_SUCCESS && host) r = vkMapMemory(b->dev, k->mem, 0, VK_WHOLE_SIZE, 0, &k->map);
    if (r != VK_SUCCESS) {
        if (!quiet) vk_fail(b, r, "allocating device memory");
        block_destroy(b, k);
        return NULL;
    }
    return k;
}

static int block_take(vk_block *k, VkDeviceSize size, VkDeviceSize *off) {
    for (int i = 0; i < k->nfr; i++) {
        if (k->fr[i][1] < size) continue;
        *off = k->fr[i][0];
        k->fr[i][0] += size;
        k->fr[i][1] -= size;
        if (!k->fr[i][1]) {
            memmove(&k->fr[i], &k->fr[i + 1], (size_t)(k->nfr - i - 1) * sizeof k->fr[0]);
            k->nfr--;
        }
        return 1;
    }
    return 0;
}

static int block_give(vk_block *k, VkDeviceSize off, VkDeviceSize size) {
    int i = 0;
    while (i < k->nfr && k->fr[i][0] < off) i++;
    int prev = i > 0 && k->fr[i - 1][0] + k->fr[i - 1][1] == off;
    int next = i < k->nfr && off + size == k->fr[i][0];
    if (prev && next) {
        k->fr[i - 1][1] += size + k->fr[i][1];
        memmove(&k->fr[i], &k->fr[i + 1], (size_t)(k->nfr - i - 1) * sizeof k->fr[0]);
        k->nfr--;
    } else if (prev) {
        k->fr[i - 1][1] += size;
    } else if (next) {
        k->fr[i][0] = off;
        k->fr[i][1] += size;
    } else {
        void *p = grow(k->fr, &k->capfr, k->nfr + 1, sizeof k->fr[0]);
        if (!p) return 0; /* the range is lost to this block; not fatal */
        k->fr = p;
        memmove(&k->fr[i + 1], &k->fr[i], (size_t)(k->nfr - i) * sizeof k->fr[0]);
        k->fr[i][0] = off;
        k->fr[i][1] = size;
        k->nfr++;
    }
    return 1;
}

static VkDeviceSize held_bytes(const lmh_backend *b) {
    VkDeviceSize n = 0;
    for (int i = 0; i < b->nblocks; i++) n += b->blocks[i]->size;
    return n;
}

/* A size for messages: bytes, KiB or MiB. */
static const char *human(char buf[32], VkDeviceSize n) {
    if (n < 1024)
        snprintf(buf, 32, "%llu bytes", (unsigned long long)n);
    else if (n < MIB)
        snprintf(buf, 32, "%.1f KiB", (double)n / 1024.0);
    else
        snprintf(buf, 32, "%.1f MiB", (double)n / (double)MIB);
    return buf;
}

/* Option max-memory=N[K|M|G]: the most device memory this backend takes; -1 when the
 * value is malformed. */
static long long mem_cap(const char *v) {
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    int shift = *end == 'k' || *end == 'K'   ? 10
                : *end == 'm' || *end == 'M' ? 20
                : *end == 'g' || *end == 'G' ? 30
                                             : 0;
    if (shift) end++;
    if (end == v || *end || !n || n > (1ull << 40)) return -1;
    return (long long)(n << shift);
}

static vk_alloc *mem_alloc(lmh_backend *b, VkDeviceSize bytes, int weight) {
    VkDeviceSize size = (bytes + ALLOC_ALIGN - 1) / ALLOC_ALIGN * ALLOC_ALIGN;
    if (!size) size = ALLOC_ALIGN;
    vk_alloc *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->size = size;
    a->weight = weight;
    a->gen = ++b->gen_next;
    for (int i = 0; i < b->nblocks; i++) {
        vk_block *k = b->blocks[i];
        if (k->weight != weight || k->dedicated || k->host) continue;
        if (block_take(k, size, &a->off)) {
            a->blk = k;
            return a;
        }
    }
    /* a new block: twice the last of its kind, up to BLOCK_MAX; its own when larger */
    VkDeviceSize bs = BLOCK_MIN;
    for (int i = 0; i < b->nblocks; i++)
        if (b->blocks[i]->weight == weight && !b->blocks[i]->dedicated && !b->blocks[i]->host &&
            b->blocks[i]->size * 2 > bs)
            bs = b->blocks[i]->size * 2;
    if (bs > BLOCK_MAX) bs = BLOCK_MAX;
    if (bs > b->max_alloc) bs = b->max_alloc;
    if (size > b->max_alloc) {
        vk_log(b, LMH_LOG_ERROR,
               "a tensor of %.1f MiB exceeds the largest allocation %s allows (%.1f MiB)",
               (double)bytes / (double)MIB, b->props.deviceName,
               (double)b->max_alloc / (double)MIB);
        free(a);
        return NULL;
    }
    /* under max-memory, what would pass the cap fails as the driver's would */
    long long cap = (long long)b->max_memory;
    VkDeviceSize held = held_bytes(b), room = (VkDeviceSize)-1;
    if (cap > 0)
        room =
            (VkDeviceSize)cap > held ? ((VkDeviceSize)cap - held) / ALLOC_ALIGN * ALLOC_ALIGN : 0;
    if (cap > 0 && bs > room / 8) /* smaller blocks, so that the cap is what runs out */
        bs = room / 8 / ALLOC_ALIGN * ALLOC_ALIGN > size ? room / 8 / ALLOC_ALIGN * ALLOC_ALIGN
                                                         : size;
    int dedicated = size > bs;
    if (dedicated) bs = size;
    vk_block *k = NULL;
    void *p = grow(b->blocks, &b->capblocks, b->nblocks + 1, sizeof *b->blocks);
    if (p) b->blocks = p;
    if (p && size <= room) {
        k = block_new(b, bs, 0, 1);
        if (!k && !dedicated && bs > size) { /* a smaller block may still fit */
            bs = size > BLOCK_MIN ? size : BLOCK_MIN;
            if (bs > room) bs = size;
            k = block_new(b, bs, 0, 1);
        }
    }
    if (!k) {
        char need[32], have[32], lim[32];
        vk_log(b, LMH_LOG_ERROR,
               "out of device memory: cannot allocate %s for a %s tensor (%s held on %s%s%s)",
               human(need, bytes), weight ? "weight" : "scratch/cache", human(have, held),
               b->props.deviceName, cap > 0 ? ", max-memory=" : "",
               cap > 0 ? human(lim, (VkDeviceSize)cap) : "");
        free(a);
        return NULL;
    }
    k->weight = weight;
    k->dedicated = dedicated;
    if (!block_give(k, 0, bs) || !block_take(k, size, &a->off)) {
        block_destroy(b, k);
        free(a);
        return NULL;
    }
    b->blocks[b->nblocks++] = k;
    a->blk = k;
    return a;
}

static void mem_free(lmh_backend *b, vk_alloc *a) {
    vk_block *k = a->blk;
    block_give(k, a->off, a->size);
    free(a);
    /* give an empty block back unless it is the last of its kind */
    if (k->nfr != 1 || k->fr[0][1] != k->size) return;
    int others = 0, at = -1;
    for (int i = 0; i < b->nblocks; i++) {
        if (b->blocks[i] == k)
            at = i;
        else if (b->blocks[i]->weight == k->weight && !b->blocks[i]->dedicated &&
                 !b->blocks[i]->host)
            others++;
    }
    if (at < 0 || (!k->dedicated && !others)) return;
    b->blocks[at] = b->blocks[--b->nblocks];
    block_destroy(b, k);
}

/* Frees now, or once the batches that used it have completed. */
static void alloc_release(lmh_backend *b, vk_alloc *a) {
    if (a->last_use <= b->done) {
        mem_free(b, a);
        return;
    }
    void *p = grow(b->defer, &b->capdefer, b->ndefer + 1, sizeof *b->defer);
    if (!p) { /* cannot defer: wait for the work instead */
        vk_log(b, LMH_LOG_WARN, "out of host memory deferring a free; memory leaked");
        return;
    }
    b->defer = p;
    b->defer[b->ndefer++] = a;
}

static void free_deferred(lmh_backend *b) {
    int j = 0;
    for (int i = 0; i < b->ndefer; i++) {
        if (b->defer[i]->last_use <= b->done)
            mem_free(b, b->defer[i]);
        else
            b->defer[j++] = b->defer[i];
    }
    b->ndefer = j;
}

static int hostbuf_new(lmh_backend *b, vk_hostbuf *h, VkDeviceSize size, int readback) {
    VkBufferCreateInfo bi = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = size,
        .usage = readback ? VK_BUFFER_USAGE_TRANSFER_DST_BIT : VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    VkResult r = vkCreateBuffer(b->dev, &bi, NULL, &h->buf);
    if (r != VK_SUCCESS) return vk_fail(b, r, "vkCreateBuffer (host)");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(b->dev, h->buf, &req);
    VkMemoryPropertyFlags need =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    /* staging prefers plain system memory, read-back cached memory */
    int type = readback
                   ? pick_type(b, req.memoryTypeBits, need, VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0)
                   : pick_type(b, req.memoryTypeBits, need, 0, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    if (type < 0) {
        vkDestroyBuffer(b->dev, h->buf, NULL);
        h->buf = VK_NULL_HANDLE;
        vk_log(b, LMH_LOG_ERROR, "no host-visible coherent memory type");
        return LMH_EUNSUPPORTED;
    }
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                               .allocationSize = req.size,
                               .memoryTypeIndex = (uint32_t)type};
    r = vkAllocateMemory(b->dev, &ai, NULL, &h->mem);
    if (r == VK_SUCCESS) r = vkBindBufferMemory(b->dev, h->buf, h->mem, 0);
    if (r == VK_SUCCESS) r = vkMapMemory(b->dev, h->mem, 0, VK_WHOLE_SIZE, 0, &h->map);
    if (r != VK_SUCCESS) {
        vkDestroyBuffer(b->dev, h->buf, NULL);
        if (h->mem) vkFreeMemory(b->dev, h->mem, NULL);
        memset(h, 0, sizeof *h);
        return vk_fail(b, r, "allocating host-visible memory");
    }
    h->size = size;
    return LMH_OK;
}

static void hostbuf_free(lmh_backend *b, vk_hostbuf *h) {
    if (h->buf) vkDestroyBuffer(b->dev, h->buf, NULL);
    if (h->mem) vkFreeMemory(b->dev, h->mem, NULL);
    memset(h, 0, sizeof *h);
}

/* ---- batches ---------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void cmd_barrier(VkCommandBuffer cb, VkPipelineStageFlags dst_stage, VkAccessFlags dst) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask =
                              VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = dst};
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         dst_stage, 0, 1, &mb, 0, NULL, 0, NULL);
}

/* Between two compute dispatches the barrier says only that: shader writes before shader
 * reads and writes. Where a copy or an indirect dispatch is on either side it takes every
 * stage and access. (The all-stages form cost NVIDIA's driver more per step.) */
static void barrier(vk_batch *bt, int heavy) {
    if (!heavy) {
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                              .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                              .dstAccessMask =
                                  VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
        vkCmdPipelineBarrier(bt->cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
        return;
    }
    cmd_barrier(bt->cb,
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                    VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                    VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT |
                    VK_ACCESS_INDIRECT_COMMAND_READ_BIT);
}

/* profile=3: a timestamp once what was recorded before it has run, ending the step
 * recorded since the previous one (the first of a batch ends none: the time between
 * batches is not a step's) */
static void step_mark(lmh_backend *b, vk_batch *bt, int first) {
    if (b->profile != 3 || !bt->queries || bt->nqueries >= 2 * MAX_DISPATCH) return;
    vkCmdWriteTimestamp(bt->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, bt->queries, bt->nqueries);
    if (!first) {
        bt->steps[bt->nqueries] = b->step_cur;
        memset(&b->step_cur, 0, sizeof b->step_cur);
    }
    bt->nqueries++;
}

static void read_steps(lmh_backend *b, vk_batch *bt) {
    uint64_t ts[2 * MAX_DISPATCH];
    if (bt->nqueries < 2 ||
        vkGetQueryPoolResults(b->dev, bt->queries, 0, bt->nqueries, bt->nqueries * sizeof *ts, ts,
                              sizeof *ts, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT))
        return;
    /* the device's idle time since the previous batch ended (batches complete in order) */
    double gap = b->prof_last_end ? (double)(int64_t)(ts[0] - b->prof_last_end) *
                                        b->props.limits.timestampPeriod * 1e-3
                                  : -1;
    if (gap >= 0 && gap < 1000) {
        b->prof_gap_us += gap;
        b->prof_gaps++;
    }
    b->prof_last_end = ts[bt->nqueries - 1];
    for (uint32_t i = 1; i < bt->nqueries; i++) {
        const vk_step *st = &bt->steps[i];
        int k = 0;
        while (k < b->nprof_step && memcmp(&b->prof_step[k].s, st, sizeof *st)) k++;
        if (k == PROF_STEPS) continue;
        if (k == b->nprof_step) b->prof_step[b->nprof_step++].s = *st;
        b->prof_step[k].us += (double)(ts[i] - ts[i - 1]) * b->props.limits.timestampPeriod * 1e-3;
        b->prof_step[k].n++;
    }
}

static void read_profile(lmh_backend *b, vk_batch *bt) {
    if (b->profile == 3) read_steps(b, bt);
    if (!bt->nqueries || b->profile == 3) {
        bt->nqueries = 0;
        return;
    }
    uint64_t *ts = malloc(2 * bt->nqueries * sizeof *ts);
    if (ts && vkGetQueryPoolResults(
                  b->dev, bt->queries, 0, 2 * bt->nqueries, 2 * bt->nqueries * sizeof *ts, ts,
                  sizeof *ts, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS)
        for (uint32_t i = 0; i < bt->nqueries; i++) {
            int sh = bt->query_shader[i];
            double us =
                (double)(ts[2 * i + 1] - ts[2 * i]) * b->props.limits.timestampPeriod * 1e-3;
            b->prof_us[sh] += us;
            b->prof_n[sh]++;
            if (bt->query_kernel[i]) {
                bt->query_kernel[i]->prof_us += us;
                bt->query_kernel[i]->prof_n++;
            }
            if (b->profile < 2) continue;
            int k = 0;
            while (k < b->nprof_shape && (b->prof_shape[k].shader != sh ||
                                          b->prof_shape[k].groups != bt->query_groups[i]))
                k++;
            if (k == PROF_SHAPES) continue;
            if (k == b->nprof_shape) {
                b->nprof_shape++;
                b->prof_shape[k].shader = sh;
                b->prof_shape[k].groups = bt->query_groups[i];
            }
            b->prof_shape[k].us += us;
            b->prof_shape[k].n++;
        }
    free(ts);
    bt->nqueries = 0;
}

static void retire(lmh_backend *b, vk_batch *bt) {
    read_profile(b, bt);
    if (bt->stats)
        for (int i = 0; i < bt->nmoe; i++)
            b->weight_read += (uint64_t)((const uint32_t *)bt->stats->map)[bt->moe[i].slot] *
                              bt->moe[i].bytes_per_expert;
    bt->nmoe = 0;
    bt->state = 0;
    b->done = bt->serial;
}

/* a spinning thread's hint to the core (and its hyperthread sibling) */
static void cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Waits for every submitted batch with a serial <= serial, oldest first (polling each
 * fence for up to spin_us before sleeping on it). */
static int wait_upto(lmh_backend *b, uint64_t serial) {
    for (;;) {
        vk_batch *old = NULL;
        for (int i = 0; i < VK_NBATCH; i++)
            if (b->batch[i].state == 2 && b->batch[i].serial <= serial &&
                (!old || b->batch[i].serial < old->serial))
                old = &b->batch[i];
        if (!old) break;
        double t0 = b->profile ? now_s() : 0;
        VkResult r = VK_NOT_READY;
        if (b->spin_us) {
            double until = now_s() + b->spin_us * 1e-6;
            while ((r = vkGetFenceStatus(b->dev, old->fence)) == VK_NOT_READY && now_s() < until)
                cpu_pause();
        }
        if (r == VK_NOT_READY) r = vkWaitForFences(b->dev, 1, &old->fence, VK_TRUE, UINT64_MAX);
        if (b->profile) b->prof_wait_s += now_s() - t0;
        if (r == VK_SUCCESS) r = vkResetFences(b->dev, 1, &old->fence);
        if (r != VK_SUCCESS) {
            int rc = vk_fail(b, r, "waiting for the device");
            b->err = rc;
            return rc;
        }
        retire(b, old);
    }
    free_deferred(b);
    /* The ranges since the last barrier stay tracked: a fence wait on the host orders
     * nothing between the device's work in one submission and the next, so a later batch
     * that reads what an earlier one wrote still needs its barrier. */
    return LMH_OK;
}

static int submit(lmh_backend *b) {
    if (b->cur < 0) return LMH_OK;
    vk_batch *bt = &b->batch[b->cur];
    b->cur = -1;
    /* make results (downloads, MoE statistics) visible to the host */
    cmd_barrier(bt->cb, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    step_mark(b, bt, 0);
    VkResult r = vkEndCommandBuffer(bt->cb);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                       .commandBufferCount = 1,
                       .pCommandBuffers = &bt->cb};
    if (r == VK_SUCCESS) r = vkQueueSubmit(b->queue, 1, &si, bt->fence);
    if (r != VK_SUCCESS) {
        bt->state = 0;
        b->err = vk_fail(b, r, "vkQueueSubmit");
        if (b->err == LMH_ENOMEM) b->err = LMH_EIO; /* the recorded work is lost */
        return b->err;
    }
    bt->state = 2;
    b->prof_submits++;
    return LMH_OK;
}

/* Whether every submitted batch has completed: the device has nothing to do. */
static int device_idle(lmh_backend *b) {
    for (int i = 0; i < VK_NBATCH; i++)
        if (b->batch[i].state == 2 && vkGetFenceStatus(b->dev, b->batch[i].fence) != VK_SUCCESS)
            return 0;
    return 1;
}

static vk_batch *batch_begin(lmh_backend *b) {
    if (b->err) return NULL;
    if (b->cur >= 0) return &b->batch[b->cur];
    int i = (b->last + 1) % VK_NBATCH;
    vk_batch *bt = &b->batch[i];
    if (bt->state == 2 && wait_upto(b, bt->serial) != LMH_OK) return NULL;
    for (int p = 0; p < bt->npools; p++) vkResetDescriptorPool(b->dev, bt->pools[p], 0);
    bt->pool_sets = bt->npools ? 0 : POOL_SETS;
    if (bt->npools > 1) { /* keep one pool; the others were for a burst */
        for (int p = 1; p < bt->npools; p++) vkDestroyDescriptorPool(b->dev, bt->pools[p], NULL);
        bt->npools = 1;
    }
    bt->staging_used = 0;
    bt->args_used = 0;
    bt->ndispatch = 0;
    bt->nmoe = 0;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VkResult r = vkResetCommandBuffer(bt->cb, 0);
    if (r == VK_SUCCESS) r = vkBeginCommandBuffer(bt->cb, &bi);
    if (r != VK_SUCCESS) {
        b->err = vk_fail(b, r, "vkBeginCommandBuffer");
        return NULL;
    }
    bt->nqueries = 0;
    if (bt->queries) vkCmdResetQueryPool(bt->cb, bt->queries, 0, 2 * MAX_DISPATCH);
    step_mark(b, bt, 1);
    bt->serial = ++b->serial;
    bt->state = 1;
    b->cur = i;
    b->last = i;
    return bt;
}

/* Submits what is recorded and waits for the batches up to `serial`. */
static int wait_for(lmh_backend *b, uint64_t serial) {
    int rc = submit(b);
    int rc2 = wait_upto(b, serial);
    if (!rc && !rc2 && b->validation_errors) {
        b->validation_errors = 0;
        return LMH_EINTERNAL; /* vk-validate: the layer found an error */
    }
    return rc ? rc : rc2 ? rc2 : b->err;
}

static int wait_all(lmh_backend *b) {
    return wait_for(b, b->serial);
}

static VkDescriptorSet alloc_set(lmh_backend *b, vk_batch *bt) {
    if (bt->pool_sets >= POOL_SETS) {
        void *p = realloc(bt->pools, (size_t)(bt->npools + 1) * sizeof *bt->pools);
        if (!p) return VK_NULL_HANDLE;
        bt->pools = p;
        VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, POOL_SETS * VK_NBIND};
        VkDescriptorPoolCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                         .maxSets = POOL_SETS,
                                         .poolSizeCount = 1,
                                         .pPoolSizes = &ps};
        VkResult r = vkCreateDescriptorPool(b->dev, &ci, NULL, &bt->pools[bt->npools]);
        if (r != VK_SUCCESS) {
            vk_fail(b, r, "vkCreateDescriptorPool");
            return VK_NULL_HANDLE;
        }
        bt->npools++;
        bt->pool_sets = 0;
    }
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                      .descriptorPool = bt->pools[bt->npools - 1],
                                      .descriptorSetCount = 1,
                                      .pSetLayouts = &b->dsl};
    VkDescriptorSet set;
    VkResult r = vkAllocateDescriptorSets(b->dev, &ai, &set);
    if (r != VK_SUCCESS) {
        vk_fail(b, r, "vkAllocateDescriptorSets");
        return VK_NULL_HANDLE;
    }
    bt->pool_sets++;
    return set;
}

/* ---- hazards ---------------------------------------------------------------------- */

static vk_range range_of(const vk_tensor *t) {
    /* whole 16-byte words: 16-bit writes touch their word's other half */
    vk_range r = {t->a->blk, t->off & ~(VkDeviceSize)15,
                  (t->off + t->bytes + 15) & ~(VkDeviceSize)15};
    if (r.hi == r.lo) r.hi = r.lo + 16;
    return r;
}

/* Appends r to list (n entries), merged into the last entry where the two touch (rows of
 * one tensor, one sequence after another); the new count. */
static int add_range(vk_range *list, int n, vk_range r) {
    vk_range *l = n ? &list[n - 1] : NULL;
    if (l && l->blk == r.blk && r.lo <= l->hi && l->lo <= r.hi) {
        if (r.lo < l->lo) l->lo = r.lo;
        if (r.hi > l->hi) l->hi = r.hi;
        return n;
    }
    list[n] = r;
    return n + 1;
}

static int overlaps(const vk_range *list, int n, const vk_range *r) {
    for (int i = 0; i < n; i++)
        if (list[i].blk == r->blk && list[i].lo < r->hi && r->lo < list[i].hi) return 1;
    return 0;
}

/* Records a barrier when the new reads/writes depend on those since the last one (or
 * when that many independent ones have piled up that checking them costs more). */
static int track(lmh_backend *b, vk_batch *bt, const vk_range *rd, int nrd, const vk_range *wr,
                 int nwr, int xfer) {
    int need = b->nrd + b->nwr > 256;
    for (int i = 0; i < nrd && !need; i++) need = overlaps(b->wr, b->nwr, &rd[i]);
    for (int i = 0; i < nwr && !need; i++)
        need = overlaps(b->wr, b->nwr, &wr[i]) || overlaps(b->rd, b->nrd, &wr[i]);
    /* a write before a compute-only barrier is not yet visible to a copy or an indirect
     * dispatch, whatever it touches */
    need |= xfer && b->compute_only_since;
    if (need) {
        int heavy = xfer || b->xfer_since_barrier || b->full_barriers;
        step_mark(b, bt, 0);
        b->step_cur.heavy = (uint8_t)heavy;
        barrier(bt, heavy);
        b->compute_only_since = !heavy;
        b->nrd = b->nwr = 0;
        b->xfer_since_barrier = 0;
    }
    b->xfer_since_barrier |= xfer;
    void *p = grow(b->rd, &b->caprd, b->nrd + nrd + 1, sizeof *b->rd);
    if (!p) return LMH_ENOMEM;
    b->rd = p;
    p = grow(b->wr, &b->capwr, b->nwr + nwr + 1, sizeof *b->wr);
    if (!p) return LMH_ENOMEM;
    b->wr = p;
    if (nrd) memcpy(b->rd + b->nrd, rd, (size_t)nrd * sizeof *rd);
    if (nwr) memcpy(b->wr + b->nwr, wr, (size_t)nwr * sizeof *wr);
    b->nrd += nrd;
    b->nwr += nwr;
    return LMH_OK;
}

/* ---- pipelines -------------------------------------------------------------------- */

/* Profiling: what the driver says of a pipeline it compiled (on NVIDIA: registers a thread,
 * shared memory, spills), the first thing to look at when a kernel runs below the memory's
 * rate, since Vulkan gives no profiler's view of a dispatch. */
static void log_pipe_stats(lmh_backend *b, VkPipeline pl, const char *name, const uint32_t *spec) {
    PFN_vkGetPipelineExecutableStatisticsKHR get =
        (PFN_vkGetPipelineExecutableStatisticsKHR)(uintptr_t)vkGetDeviceProcAddr(
            b->dev, "vkGetPipelineExecutableStatisticsKHR");
    if (!get) return;
    VkPipelineExecutableInfoKHR ei = {.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR,
                                      .pipeline = pl};
    VkPipelineExecutableStatisticKHR st[32];
    uint32_t n = 32;
    for (uint32_t i = 0; i < n; i++)
        st[i] = (VkPipelineExecutableStatisticKHR){
            .sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR};
    VkResult r = get(b->dev, &ei, &n, st);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) return;
    char line[1024];
    int len = snprintf(line, sizeof line, "pipeline stats %s (%u %u %u %u %u %u):", name, spec[0],
                       spec[1], spec[2], spec[3], spec[4], spec[5]);
    for (uint32_t i = 0; i < n && len > 0 && len < (int)sizeof line; i++) {
        const VkPipelineExecutableStatisticKHR *t = &st[i];
        size_t room = sizeof line - (size_t)len;
        switch (t->format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
            len += snprintf(line + len, room, " %s=%u", t->name, (unsigned)t->value.b32);
            break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
            len += snprintf(line + len, room, " %s=%lld", t->name, (long long)t->value.i64);
            break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
            len +=
                snprintf(line + len, room, " %s=%llu", t->name, (unsigned long long)t->value.u64);
            break;
        default:
            len += snprintf(line + len, room, " %s=%g", t->name, t->value.f64);
        }
    }
    vk_log(b, LMH_LOG_INFO, "%s", line);
}

static VkPipeline pipeline(lmh_backend *b, enum vk_shader sh, const uint32_t *spec) {
    for (int i = 0; i < b->npipes; i++)
        if (b->pipes[i].shader == sh && !memcmp(b->pipes[i].spec, spec, sizeof b->pipes[i].spec))
            return b->pipes[i].p;
    const vk_spirv *s = &vk_shaders[sh];
    VkResult r;
    if (!b->modules[sh]) {
        int sg = b->subgroup_arith && s->code_sg;
        VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                       .codeSize = sg ? s->size_sg : s->size,
                                       .pCode = sg ? s->code_sg : s->code};
        r = vkCreateShaderModule(b->dev, &mi, NULL, &b->modules[sh]);
        if (r != VK_SUCCESS) {
            vk_fail(b, r, "vkCreateShaderModule");
            b->modules[sh] = VK_NULL_HANDLE;
            return VK_NULL_HANDLE;
        }
    }
    VkSpecializationMapEntry map[VK_NSPEC];
    for (uint32_t i = 0; i < VK_NSPEC; i++) map[i] = (VkSpecializationMapEntry){i, i * 4, 4};
    VkSpecializationInfo si = {VK_NSPEC, map, VK_NSPEC * 4, spec};
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = b->modules[sh],
                  .pName = "main",
                  .pSpecializationInfo = &si},
        .layout = b->layout,
    };
    void *p = grow(b->pipes, &b->cappipes, b->npipes + 1, sizeof *b->pipes);
    if (!p) return VK_NULL_HANDLE;
    b->pipes = p;
    VkPipeline pl;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (b->pipe_stats) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
    r = vkCreateComputePipelines(b->dev, VK_NULL_HANDLE, 1, &ci, NULL, &pl);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    vk_log(b, LMH_LOG_DEBUG, "pipeline %s (%u %u %u %u %u %u %u %u %u): %.1f ms", s->name, spec[0],
           spec[1], spec[2], spec[3], spec[4], spec[5], spec[6], spec[7], spec[8],
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6);
    if (r != VK_SUCCESS) {
        vk_fail(b, r, "vkCreateComputePipelines");
        vk_log(b, LMH_LOG_ERROR, "  (shader %s)", s->name);
        return VK_NULL_HANDLE;
    }
    if (b->pipe_stats) log_pipe_stats(b, pl, s->name, spec);
    vk_pipe *np = &b->pipes[b->npipes++];
    np->shader = sh;
    memcpy(np->spec, spec, sizeof np->spec);
    np->p = pl;
    return pl;
}

/* ---- recording -------------------------------------------------------------------- */

/* The range a tensor is bound with: from its offset rounded down to the descriptor
 * alignment (the shaders get the rest as an element offset) to its end rounded up to
 * whole 16 bytes, within its allocation (whose size is a multiple of 256). */
static VkDeviceSize bind_range(const lmh_backend *b, const vk_tensor *t, VkDeviceSize *base) {
    *base = t->off & ~(b->align - 1);
    VkDeviceSize end = (t->off + t->bytes + 15) & ~(VkDeviceSize)15;
    VkDeviceSize aend = t->a->off + t->a->size;
    if (end > aend) end = aend;
    if (end <= *base) end = *base + 16;
    return end - *base;
}

VkDeviceAddress vk_addr(const vk_tensor *t) {
    return t->a->blk->addr ? t->a->blk->addr + t->off : 0;
}

uint32_t vk_elem_off(const lmh_backend *b, const vk_tensor *t) {
    VkDeviceSize base;
    bind_range(b, t, &base);
    size_t es = lmh_dtype_is_packed(t->t.dtype) ? 4 : lmh_dtype_size(t->t.dtype);
    return (uint32_t)((t->off - base) / (es ? es : 1));
}

int vk_bindable(const lmh_backend *b, const lmh_tensor *x) {
    VkDeviceSize base;
    return bind_range(b, VT(x), &base) <= b->max_range;
}

static int record(lmh_backend *b, const vk_dispatch *d);

/* Records one dispatch. A batch goes to the device when it is full, or, once it holds
 * submit_min dispatches, as soon as the device has run out of work: the device then starts
 * on a step's first ops while the host records the rest, instead of waiting for the whole
 * step (or 256 dispatches) to be recorded. */
int vk_record(lmh_backend *b, const vk_dispatch *d) {
    double t0 = b->profile ? now_s() : 0;
    int rc = record(b, d);
    if (!rc && b->cur >= 0) {
        int n = b->batch[b->cur].ndispatch;
        if (n >= MAX_DISPATCH || (n >= b->submit_min && device_idle(b))) rc = submit(b);
    }
    if (b->profile) b->prof_record_s += now_s() - t0;
    return rc;
}

static int record(lmh_backend *b, const vk_dispatch *d) {
    if (b->err) return b->err;
    vk_batch *bt = batch_begin(b);
    if (!bt) return b->err ? b->err : LMH_EIO;
    VkPipeline p = d->pipe ? d->pipe : pipeline(b, d->shader, d->spec);
    if (!p) return LMH_EINTERNAL;
    VkDescriptorSet set = VK_NULL_HANDLE;
    if (!b->push_set && !(set = alloc_set(b, bt))) return LMH_ENOMEM;
    VkDescriptorBufferInfo bi[VK_NBIND];
    VkWriteDescriptorSet w[VK_NBIND];
    vk_range rd_[VK_NBIND + 1], wr_[VK_NBIND], *rd = rd_, *wr = wr_;
    int nrd = 0, nwr = 0;
    if (d->nxrd || d->nxwr) { /* tensors reached by address: their ranges too */
        rd = malloc((VK_NBIND + 1 + (size_t)d->nxrd) * sizeof *rd);
        wr = malloc((VK_NBIND + (size_t)d->nxwr) * sizeof *wr);
        if (!rd || !wr) {
            free(rd);
            free(wr);
            return LMH_ENOMEM;
        }
    }
    uint32_t pc[VK_PC_WORDS];
    memcpy(pc, d->pc, sizeof pc);
    for (int i = 0; i < VK_NBIND; i++) {
        const vk_tensor *t = d->bind[i] ? d->bind[i] : b->dummy;
        VkDeviceSize base, range = bind_range(b, t, &base);
        bi[i] = (VkDescriptorBufferInfo){t->a->blk->buf, base, range};
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                      .dstSet = set,
                                      .dstBinding = (uint32_t)i,
                                      .descriptorCount = 1,
                                      .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                      .pBufferInfo = &bi[i]};
        if (i < 5) { /* quantized tensors are addressed in words */
            size_t es = lmh_dtype_is_packed(t->t.dtype) ? 4 : lmh_dtype_size(t->t.dtype);
            pc[i] = (uint32_t)((t->off - base) / (es ? es : 1));
        }
        if (d->bind[i]) {
            if (d->writes & (1u << i)) {
                wr[nwr++] = range_of(t);
                t->a->gen = ++b->gen_next;
            } else {
                rd[nrd++] = range_of(t);
            }
        }
    }
    if (d->indirect) rd[nrd++] = range_of(d->indirect);
    for (int i = 0; i < d->nxrd; i++) nrd = add_range(rd, nrd, range_of(d->xrd[i]));
    for (int i = 0; i < d->nxwr; i++) {
        nwr = add_range(wr, nwr, range_of(d->xwr[i]));
        d->xwr[i]->a->gen = ++b->gen_next;
    }
    int rc = track(b, bt, rd, nrd, wr, nwr, d->indirect != NULL);
    if (rd != rd_) {
        free(rd);
        free(wr);
    }
    if (rc) return rc;
    vkCmdBindPipeline(bt->cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
    if (b->push_set) {
        b->push_set(bt->cb, VK_PIPELINE_BIND_POINT_COMPUTE, b->layout, 0, VK_NBIND, w);
    } else {
        vkUpdateDescriptorSets(b->dev, VK_NBIND, w, 0, NULL);
        vkCmdBindDescriptorSets(bt->cb, VK_PIPELINE_BIND_POINT_COMPUTE, b->layout, 0, 1, &set, 0,
                                NULL);
    }
    vkCmdPushConstants(bt->cb, b->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, pc);
    uint32_t q = bt->nqueries,
             groups = d->indirect ? 0 : d->groups[0] * d->groups[1] * d->groups[2];
    int per_dispatch = bt->queries && q < MAX_DISPATCH && b->profile < 3;
    if (b->profile == 3) {
        vk_step *st = &b->step_cur;
        if (st->n < STEP_NAMED) {
            st->shader[st->n] = (uint8_t)d->shader;
            st->groups[st->n] = groups;
        }
        if (st->n < 255) st->n++;
    }
    if (per_dispatch) {
        vkCmdWriteTimestamp(bt->cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, bt->queries, 2 * q);
        bt->query_shader[q] = (uint8_t)d->shader;
        bt->query_groups[q] = groups;
        bt->query_kernel[q] = d->kernel;
    }
    if (d->indirect)
        vkCmdDispatchIndirect(bt->cb, d->indirect->a->blk->buf, d->indirect->off);
    else
        vkCmdDispatch(bt->cb, d->groups[0], d->groups[1], d->groups[2]);
    if (per_dispatch) {
        vkCmdWriteTimestamp(bt->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, bt->queries, 2 * q + 1);
        bt->nqueries++;
    }
    for (int i = 0; i < VK_NBIND; i++)
        (d->bind[i] ? d->bind[i] : b->dummy)->a->last_use = bt->serial;
    if (d->indirect) d->indirect->a->last_use = bt->serial;
    for (int i = 0; i < d->nxrd; i++) d->xrd[i]->a->last_use = bt->serial;
    for (int i = 0; i < d->nxwr; i++) d->xwr[i]->a->last_use = bt->serial;
    bt->ndispatch++;
    return LMH_OK;
}

int vk_moe_slot(lmh_backend *b, uint64_t bytes_per_expert, const vk_tensor **stats) {
    vk_batch *bt = batch_begin(b);
    if (bt && bt->nmoe >= STAT_SLOTS) {
        if (submit(b) != LMH_OK) return -1;
        bt = batch_begin(b);
    }
    if (!bt) return -1;
    if (!bt->stats) {
        bt->stats = block_new(b, STAT_SLOTS * 4, 1, 0);
        bt->stats_t = calloc(1, sizeof *bt->stats_t);
        vk_alloc *a = calloc(1, sizeof *a);
        if (!bt->stats || !bt->stats_t || !a) {
            free(a);
            return -1;
        }
        a->blk = bt->stats;
        a->size = STAT_SLOTS * 4;
        bt->stats_t->a = a;
        bt->stats_t->bytes = STAT_SLOTS * 4;
        bt->stats_t->t.dtype = LMH_U32;
        bt->stats_t->t.ndim = 1;
        bt->stats_t->t.ne[0] = STAT_SLOTS;
    }
    void *p = grow(bt->moe, &bt->capmoe, bt->nmoe + 1, sizeof *bt->moe);
    if (!p) return -1;
    bt->moe = p;
    bt->moe[bt->nmoe] = (vk_moe_stat){(uint32_t)bt->nmoe, bytes_per_expert};
    *stats = bt->stats_t;
    return bt->nmoe++;
}

vk_tensor *vk_args(lmh_backend *b, size_t n, void **map) {
    if (!n || n > ARGS_BYTES) return NULL;
    vk_batch *bt = batch_begin(b);
    if (bt && bt->args_used + n > ARGS_BYTES) {
        if (submit(b) != LMH_OK) return NULL;
        bt = batch_begin(b);
    }
    if (!bt) return NULL;
    if (!bt->args) {
        vk_alloc *a = calloc(1, sizeof *a);
        /* the device reads these tables from its own memory where it lets the host write
         * there (batched decode's attention step 4% shorter, H100), else from host memory */
        bt->args = a ? block_new(b, ARGS_BYTES, 2, 1) : NULL;
        if (a && !bt->args) bt->args = block_new(b, ARGS_BYTES, 1, 0);
        if (!bt->args) {
            free(a);
            return NULL;
        }
        a->blk = bt->args;
        a->size = ARGS_BYTES;
        bt->args_a = a;
    }
    vk_tensor *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->a = bt->args_a;
    t->off = bt->args_used;
    t->bytes = n;
    t->t.dtype = LMH_U32;
    t->t.ndim = 1;
    t->t.ne[0] = (int64_t)(n / 4);
    *map = (uint8_t *)bt->args->map + bt->args_used;
    bt->args_used = (bt->args_used + n + b->align - 1) & ~(b->align - 1);
    return t;
}

/* ---- tensors ---------------------------------------------------------------------- */

/* Plain dtypes only: quantized weights come from tensor_quant. */
static int valid_shape(lmh_dtype dt, int32_t ndim, const int64_t *ne) {
    if ((unsigned)dt >= LMH_DTYPE_COUNT || !lmh_dtype_size(dt) || ndim < 1 || ndim > LMH_MAX_DIMS)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (ne[i] < 0 || ne[i] > ((int64_t)1 << 40)) return 0;
    return 1;
}

static VkDeviceSize nbytes(lmh_dtype dt, int32_t ndim, const int64_t *ne) {
    VkDeviceSize n = lmh_dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (VkDeviceSize)ne[i];
    return n;
}

static vk_tensor *tensor_make(lmh_dtype dt, int32_t ndim, const int64_t *ne) {
    vk_tensor *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->t.dtype = dt;
    t->t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t->t.ne[i] = ne[i];
    t->t.backend_priv = t;
    t->bytes = nbytes(dt, ndim, ne);
    return t;
}

vk_tensor *vk_scratch(lmh_backend *b, VkDeviceSize bytes) {
    int64_t ne = (int64_t)((bytes + 3) / 4);
    vk_tensor *t = tensor_make(LMH_U32, 1, &ne);
    if (!t) return NULL;
    t->a = mem_alloc(b, t->bytes, 0);
    if (!t->a) {
        free(t);
        return NULL;
    }
    t->off = t->a->off;
    t->owned = 1;
    b->other_bytes += t->bytes;
    return t;
}

void vk_tensor_release(lmh_backend *b, vk_tensor *t) {
    if (!t) return;
    if (t->owned) {
        if (t->a->weight)
            b->weight_bytes -= t->bytes;
        else
            b->other_bytes -= t->bytes;
        alloc_release(b, t->a);
    }
    free(t);
}

static lmh_tensor *vk_tensor_new(lmh_backend *b, lmh_dtype dt, int32_t ndim, const int64_t *ne,
                                 uint32_t flags) {
    if (!valid_shape(dt, ndim, ne)) return NULL;
    pthread_mutex_lock(&b->mu);
    vk_tensor *t = b->err ? NULL : tensor_make(dt, ndim, ne);
    int weight = (flags & LMH_TENSOR_WEIGHT) != 0;
    if (t && !(t->a = mem_alloc(b, t->bytes, weight))) {
        free(t);
        t = NULL;
    }
    if (t) {
        t->off = t->a->off;
        t->owned = 1;
        if (weight)
            b->weight_bytes += t->bytes;
        else
            b->other_bytes += t->bytes;
        if (t->bytes > b->max_range)
            vk_log(b, LMH_LOG_WARN,
                   "a tensor of %.1f MiB exceeds this device's maxStorageBufferRange (%.1f "
                   "MiB): ops on it whole are not supported",
                   (double)t->bytes / (double)MIB, (double)b->max_range / (double)MIB);
    }
    pthread_mutex_unlock(&b->mu);
    return t ? &t->t : NULL;
}

static lmh_tensor *vk_tensor_view(lmh_backend *b, lmh_tensor *base, size_t offset, lmh_dtype dt,
                                  int32_t ndim, const int64_t *ne) {
    (void)b;
    if (!base || !valid_shape(dt, ndim, ne)) return NULL;
    const vk_tensor *bt = VT(base);
    VkDeviceSize n = nbytes(dt, ndim, ne);
    /* element offsets go to the shaders: the view must start on an element */
    if (offset > bt->bytes || n > bt->bytes - offset || offset % lmh_dtype_size(dt)) return NULL;
    vk_tensor *t = tensor_make(dt, ndim, ne);
    if (!t) return NULL;
    t->a = bt->a;
    t->off = bt->off + offset;
    return &t->t;
}

static void vk_tensor_free(lmh_backend *b, lmh_tensor *x) {
    if (!x) return;
    pthread_mutex_lock(&b->mu);
    vk_fuse_free(b, VT(x));
    vk_tensor_release(b, VT(x));
    pthread_mutex_unlock(&b->mu);
}

static int upload_locked(lmh_backend *b, vk_tensor *t, size_t off, const uint8_t *src, size_t n) {
    while (n > 0) {
        vk_batch *bt = batch_begin(b);
        if (!bt) return b->err ? b->err : LMH_EIO;
        if (!bt->staging.buf) {
            int rc = hostbuf_new(b, &bt->staging, STAGING_SIZE, 0);
            if (rc) return rc;
        }
        VkDeviceSize avail = bt->staging.size - bt->staging_used;
        if (avail < n && avail < bt->staging.size / 4) { /* take a fresh batch's staging */
            int rc = submit(b);
            if (rc) return rc;
            continue;
        }
        size_t chunk = n < avail ? n : (size_t)avail;
        memcpy((uint8_t *)bt->staging.map + bt->staging_used, src, chunk);
        vk_range wr = {t->a->blk, (t->off + off) & ~(VkDeviceSize)15,
                       (t->off + off + chunk + 15) & ~(VkDeviceSize)15};
        int rc = track(b, bt, NULL, 0, &wr, 1, 1);
        if (rc) return rc;
        t->a->gen = ++b->gen_next;
        VkBufferCopy c = {bt->staging_used, t->off + off, chunk};
        vkCmdCopyBuffer(bt->cb, bt->staging.buf, t->a->blk->buf, 1, &c);
        if (b->step_cur.copies < 255) b->step_cur.copies++;
        t->a->last_use = bt->serial;
        bt->staging_used = (bt->staging_used + chunk + 15) & ~(VkDeviceSize)15;
        src += chunk;
        off += chunk;
        n -= chunk;
        if (++bt->ndispatch >= MAX_DISPATCH && (rc = submit(b)) != LMH_OK) return rc;
    }
    return LMH_OK;
}

static int vk_upload(lmh_backend *b, lmh_tensor *x, size_t off, const void *src, size_t n) {
    if (!x || lmh_dtype_is_packed(x->dtype) || off > VT(x)->bytes || n > VT(x)->bytes - off ||
        (n && !src))
        return LMH_EINVAL;
    pthread_mutex_lock(&b->mu);
    vk_fuse_access(b, VT(x), 1);
    int rc = b->err ? b->err : vk_fuse_take_err(b);
    if (!rc) rc = upload_locked(b, VT(x), off, src, n);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* h grown to hold n bytes of read-back memory (at least `least`; contents not kept). */
static int readback_fit(lmh_backend *b, vk_hostbuf *h, size_t n, VkDeviceSize least) {
    if (n <= h->size) return LMH_OK;
    hostbuf_free(b, h); /* only downloads use it, and none is in flight on it */
    VkDeviceSize sz = least;
    while (sz < n) sz *= 2;
    return hostbuf_new(b, h, sz, 1);
}

/* Records the copy of n bytes at `off` of t into h, after the ops so far, in the batch being
 * recorded (begun if none is), whose serial goes to *serial. */
static int record_copy_out(lmh_backend *b, const vk_tensor *t, size_t off, size_t n,
                           const vk_hostbuf *h, uint64_t *serial) {
    vk_batch *bt = batch_begin(b);
    if (!bt) return b->err ? b->err : LMH_EIO;
    *serial = bt->serial;
    if (!n) return LMH_OK;
    vk_range rd = {t->a->blk, (t->off + off) & ~(VkDeviceSize)15,
                   (t->off + off + n + 15) & ~(VkDeviceSize)15};
    int rc = track(b, bt, &rd, 1, NULL, 0, 1);
    if (rc) return rc;
    VkBufferCopy c = {t->off + off, 0, n};
    vkCmdCopyBuffer(bt->cb, t->a->blk->buf, h->buf, 1, &c);
    if (b->step_cur.copies < 255) b->step_cur.copies++;
    t->a->last_use = bt->serial;
    return LMH_OK;
}

static int download_locked(lmh_backend *b, const vk_tensor *t, size_t off, void *dst, size_t n) {
    uint64_t serial;
    int rc = readback_fit(b, &b->readback, n, 1 * MIB);
    if (!rc && n) rc = record_copy_out(b, t, off, n, &b->readback, &serial);
    if (!rc) rc = wait_all(b);
    if (!rc && n) memcpy(dst, b->readback.map, n);
    return rc;
}

int vk_read_locked(lmh_backend *b, const vk_tensor *t, size_t off, void *dst, size_t n) {
    vk_fuse_access(b, t, 0);
    int rc = b->err ? b->err : vk_fuse_take_err(b);
    return rc ? rc : download_locked(b, t, off, dst, n);
}

static int vk_download(lmh_backend *b, const lmh_tensor *x, size_t off, void *dst, size_t n) {
    if (!x || lmh_dtype_is_packed(x->dtype) || off > VT(x)->bytes || n > VT(x)->bytes - off ||
        (n && !dst))
        return LMH_EINVAL;
    pthread_mutex_lock(&b->mu);
    vk_fuse_access(b, VT(x), 0);
    int rc = b->err ? b->err : vk_fuse_take_err(b);
    if (!rc) rc = download_locked(b, VT(x), off, dst, n);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* A download that does not wait (backend.h): the copy goes into the batch being recorded,
 * which is submitted at once, so that the device has the whole step while the host records
 * the next one; download_wait then waits for that batch alone. */
static int vk_download_start(lmh_backend *b, const lmh_tensor *x, size_t off, size_t n,
                             uint64_t *ticket) {
    if (!x || !ticket || lmh_dtype_is_packed(x->dtype) || off > VT(x)->bytes ||
        n > VT(x)->bytes - off)
        return LMH_EINVAL;
    pthread_mutex_lock(&b->mu);
    vk_fuse_access(b, VT(x), 0);
    int rc = b->err ? b->err : vk_fuse_take_err(b);
    struct vk_read *rs = NULL;
    for (int i = 0; !rc && !rs && i < VK_NREAD; i++)
        if (!b->reads[i].ticket) rs = &b->reads[i];
    if (!rc && !rs) rc = LMH_EUNSUPPORTED; /* the host downloads instead */
    if (!rc) rc = readback_fit(b, &rs->buf, n, 4096);
    if (!rc) rc = record_copy_out(b, VT(x), off, n, &rs->buf, &rs->serial);
    if (!rc) {
        rs->n = n;
        rs->ticket = *ticket = ++b->last_ticket;
        rc = submit(b);
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int vk_download_wait(lmh_backend *b, uint64_t ticket, void *dst, size_t n) {
    pthread_mutex_lock(&b->mu);
    struct vk_read *rs = NULL;
    for (int i = 0; ticket && !rs && i < VK_NREAD; i++)
        if (b->reads[i].ticket == ticket) rs = &b->reads[i];
    int rc = !rs || n > rs->n || (n && !dst) ? LMH_EINVAL : LMH_OK;
    /* what was recorded since (the next step) goes to the device before the host blocks */
    if (!rc) rc = wait_for(b, rs->serial);
    if (!rc && n) memcpy(dst, rs->buf.map, n);
    if (rs) rs->ticket = 0; /* ended, whatever happened */
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* A quantized weight (abi.h): the packed codes, scales and biases copied as they are into
 * one device allocation (codes, then scales, then biases, each part on 16 bytes), where
 * the q*.comp shaders read them; nothing is dequantized here. */
static lmh_tensor *vk_tensor_quant(lmh_backend *b, lmh_dtype qt, int32_t group, int32_t ndim,
                                   const int64_t *ne, const uint32_t *packed, lmh_dtype sdt,
                                   const void *scales, const void *biases) {
    /* (ABI 1.10) microscaled 4-bit: blocks as 4-bit codes, e8m0 byte scales, no biases
     * (quant.glsl's DT_E8M0) */
    const int mx = lmh_dtype_is_mxfp4(qt);
    /* (ABI 1.11) no parts at all: the allocation stays uninitialised, its rows written by
     * tensor_quant_write */
    const int own = !packed && !scales && !biases;
    int bits = mx ? 4 : lmh_quant_bits(qt);
    if (mx ? group != 32 || sdt != LMH_U8 || biases
           : (group != 32 && group != 64 && group != 128) || (!own && !biases) ||
                 (sdt != LMH_F32 && sdt != LMH_F16 && sdt != LMH_BF16))
        return NULL;
    if (!bits || (ndim != 2 && ndim != 3) || (!own && (!packed || !scales))) return NULL;
    for (int i = 0; i < ndim; i++)
        if (ne[i] <= 0 || ne[i] > ((int64_t)1 << 31)) return NULL;
    int64_t in = ne[ndim - 1], rows = ne[0] * (ndim == 3 ? ne[1] : 1);
    if (in % group || (in * bits) % 32) return NULL;
    VkDeviceSize wpr = (VkDeviceSize)(in * bits / 32), gpr = (VkDeviceSize)(in / group);
    VkDeviceSize qb = (VkDeviceSize)rows * wpr * 4,
                 sb = (VkDeviceSize)rows * gpr * lmh_dtype_size(sdt);
    VkDeviceSize at_s = (qb + 15) & ~(VkDeviceSize)15,
                 at_b = at_s + ((sb + 15) & ~(VkDeviceSize)15);
    VkDeviceSize total = mx ? at_s + ((sb + 15) & ~(VkDeviceSize)15) : at_b + sb;
    /* the shaders index scales and biases in 16-bit units with 32-bit integers */
    if (total >= ((VkDeviceSize)1 << 32) - 256) {
        vk_log(b, LMH_LOG_ERROR, "a quantized tensor of %.1f MiB is larger than 4 GiB",
               (double)total / (double)MIB);
        return NULL;
    }
    pthread_mutex_lock(&b->mu);
    vk_fuse_flush(b);
    vk_tensor *t = b->err ? NULL : tensor_make(qt, ndim, ne);
    int rc = LMH_ENOMEM;
    if (t) {
        t->t.group = group;
        t->bytes = total;
        t->q_bits = (uint32_t)bits;
        t->q_wpr = (uint32_t)wpr;
        t->q_gpr = (uint32_t)gpr;
        t->q_sdt = mx ? 3u : sdt == LMH_F16 ? 1u : sdt == LMH_BF16 ? 2u : 0u;
        t->q_scales = (uint32_t)(at_s / 4);
        t->q_biases = (uint32_t)(mx ? at_s / 4 : at_b / 4); /* (none: never read) */
        t->q_write = own;
        t->a = mem_alloc(b, total, 1);
    }
    if (t && t->a) {
        t->off = t->a->off;
        t->owned = 1;
        b->weight_bytes += total;
        rc = LMH_OK;
        if (!own) rc = upload_locked(b, t, 0, (const uint8_t *)packed, (size_t)qb);
        if (rc == LMH_OK && !own) rc = upload_locked(b, t, (size_t)at_s, scales, (size_t)sb);
        if (rc == LMH_OK && !own && !mx) rc = upload_locked(b, t, (size_t)at_b, biases, (size_t)sb);
        if (rc == LMH_OK && total > b->max_range)
            vk_log(b, LMH_LOG_WARN,
                   "a quantized tensor of %.1f MiB exceeds this device's maxStorageBufferRange "
                   "(%.1f MiB): ops on it are not supported",
                   (double)total / (double)MIB, (double)b->max_range / (double)MIB);
    }
    if (rc != LMH_OK && t) {
        if (t->a)
            vk_tensor_release(b, t);
        else
            free(t);
        t = NULL;
    }
    pthread_mutex_unlock(&b->mu);
    return t ? &t->t : NULL;
}

/* (ABI 1.11) Rows [row0, row0 + n) of a quantized tensor made without parts, from parts for
 * those rows alone: staged copies into each part's rows, in the command stream like upload's
 * (ops enqueued before read the old rows, those after the new), after what the fusion layer
 * holds that reads or writes the tensor. */
static int vk_tensor_quant_write(lmh_backend *b, lmh_tensor *x, int64_t row0, int64_t n,
                                 const uint32_t *packed, const void *scales, const void *biases) {
    if (!x || !lmh_dtype_is_packed(x->dtype)) return LMH_EINVAL;
    const vk_tensor *t = VT(x);
    const int mx = lmh_dtype_is_mxfp4(x->dtype);
    const int64_t rows = x->ne[0] * (x->ndim == 3 ? x->ne[1] : 1);
    if (!t->owned || !t->q_write || row0 < 0 || n < 0 || row0 > rows || n > rows - row0)
        return LMH_EINVAL;
    if (!n) return LMH_OK;
    if (!packed || !scales || (mx ? biases != NULL : !biases)) return LMH_EINVAL;
    const size_t ss = t->q_sdt == 3 ? 1 : t->q_sdt ? 2 : 4;
    const size_t qr = (size_t)t->q_wpr * 4, sr = (size_t)t->q_gpr * ss;
    pthread_mutex_lock(&b->mu);
    vk_fuse_access(b, t, 1);
    int rc = b->err ? b->err : vk_fuse_take_err(b);
    vk_tensor *w = VT(x);
    if (!rc) rc = upload_locked(b, w, (size_t)row0 * qr, (const uint8_t *)packed, (size_t)n * qr);
    if (!rc)
        rc = upload_locked(b, w, (size_t)t->q_scales * 4 + (size_t)row0 * sr, scales,
                           (size_t)n * sr);
    if (!rc && !mx)
        rc = upload_locked(b, w, (size_t)t->q_biases * 4 + (size_t)row0 * sr, biases,
                           (size_t)n * sr);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* ---- the table -------------------------------------------------------------------- */

static int vk_supports(lmh_backend *b, const lmh_op *op) {
    pthread_mutex_lock(&b->mu);
    int ok = vk_check_op(b, op) == LMH_OK;
    pthread_mutex_unlock(&b->mu);
    return ok;
}

static int vk_enqueue(lmh_backend *b, const lmh_op *op) {
    pthread_mutex_lock(&b->mu);
    int rc = b->err ? b->err : vk_check_op(b, op); /* refused: what is held stays held */
    if (rc == LMH_OK) rc = b->no_fuse ? vk_enqueue_op(b, op) : vk_fuse_enqueue(b, op);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int vk_sync(lmh_backend *b) {
    pthread_mutex_lock(&b->mu);
    vk_fuse_flush(b);
    int rc = b->err ? b->err : vk_fuse_take_err(b);
    if (!rc) rc = wait_all(b);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static void vk_memory(lmh_backend *b, lmh_backend_mem *m) {
    pthread_mutex_lock(&b->mu);
    m->weights = b->weight_bytes;
    m->other = b->other_bytes;
    m->mapped = 0;
    m->weight_bytes_read = b->weight_read;
    pthread_mutex_unlock(&b->mu);
}

/* The largest device-local heap's size, its index in *heap_index. */
static VkDeviceSize local_heap(const VkPhysicalDeviceMemoryProperties *mp, uint32_t *heap_index) {
    VkDeviceSize size = 0;
    for (uint32_t h = 0; h < mp->memoryHeapCount; h++)
        if (mp->memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT &&
            mp->memoryHeaps[h].size > size) {
            size = mp->memoryHeaps[h].size;
            *heap_index = h;
        }
    return size;
}

static int has_device_ext(VkPhysicalDevice pd, const char *name);

static int vk_device_memory(lmh_backend *b, uint64_t *free_bytes, uint64_t *total_bytes) {
    uint32_t h = 0;
    VkDeviceSize total = local_heap(&b->mem, &h), held = held_bytes(b), avail;
    /* what every process uses now, where the driver tells (VK_EXT_memory_budget); else
     * what this backend holds */
    VkPhysicalDeviceMemoryBudgetPropertiesEXT bud = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
    VkPhysicalDeviceMemoryProperties2 mp2 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2, .pNext = &bud};
    if (has_device_ext(b->pd, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME)) {
        vkGetPhysicalDeviceMemoryProperties2(b->pd, &mp2);
        VkDeviceSize budget = bud.heapBudget[h] ? bud.heapBudget[h] : total;
        avail = budget > bud.heapUsage[h] ? budget - bud.heapUsage[h] : 0;
    } else {
        avail = total > held ? total - held : 0;
    }
    if (b->max_memory > 0) { /* the cap this backend keeps to */
        if (total > b->max_memory) total = b->max_memory;
        VkDeviceSize room = b->max_memory > held ? b->max_memory - held : 0;
        if (avail > room) avail = room;
    }
    *free_bytes = avail;
    *total_bytes = total;
    return LMH_OK;
}

/* The device probes (bandwidth, compute peak), timed from the host: `rec` records one pass
 * and says how much work it does (bytes, FLOP); as many passes as take 20 ms a run (so that
 * submission costs little beside them), then the best of three runs, as work/s. */
typedef struct vk_probe {
    vk_tensor *buf, *dst;
    uint32_t groups;
} vk_probe;

static int time_probe(lmh_backend *b, const vk_probe *p,
                      int (*rec)(lmh_backend *, const vk_probe *, double *), double *rate) {
    int rc = vk_sync(b);
    double best = 0, work = 0;
    for (int reps = 1, runs = 0; !rc && runs < 3;) {
        double t0 = now_s();
        pthread_mutex_lock(&b->mu);
        for (int r = 0; r < reps && !rc; r++) rc = rec(b, p, &work);
        pthread_mutex_unlock(&b->mu);
        if (!rc) rc = vk_sync(b);
        double t = now_s() - t0;
        if (rc) break;
        if (t < 0.02 && reps < 4096) {
            reps *= 2;
            continue;
        }
        if (reps * work / t > best) best = reps * work / t;
        runs++;
    }
    *rate = best;
    return rc;
}

static int rec_read(lmh_backend *b, const vk_probe *p, double *bytes) {
    *bytes = (double)p->buf->bytes;
    return vk_record_read_probe(b, p->buf, p->dst);
}

static int rec_peak(lmh_backend *b, const vk_probe *p, double *flop) {
    return vk_record_peak_probe(b, p->dst, p->groups, flop);
}

/* lmh_backend_api.read_bandwidth: bw_read.comp over a buffer of 1 GiB (20 times an H100's
 * L2; less where the device cannot bind or allocate that much). */
static int vk_read_bandwidth(lmh_backend *b, double *bytes_per_s) {
    VkDeviceSize size = (VkDeviceSize)1 << 30;
    if (size > b->max_range) size = b->max_range;
    if (size > b->max_alloc) size = b->max_alloc;
    size &= ~(VkDeviceSize)4095;
    int64_t n = (int64_t)(size / 4), one = 4;
    lmh_tensor *buf = vk_tensor_new(b, LMH_F32, 1, &n, 0);
    lmh_tensor *dst = vk_tensor_new(b, LMH_F32, 1, &one, 0);
    double bps = 0;
    int rc =
        buf && dst ? time_probe(b, &(vk_probe){VT(buf), VT(dst), 0}, rec_read, &bps) : LMH_ENOMEM;
    vk_tensor_free(b, dst);
    vk_tensor_free(b, buf);
    if (!rc) rc = vk_sync(b);
    if (!rc) *bytes_per_s = bps;
    return rc;
}

/* ---- plugin kernels (ABI 1.6) ------------------------------------------------------ */

/* A plugin's SPIR-V kernel is built against the backend's own pipeline layout (its storage
 * bindings and push constants are a prefix of the layout's): struct lmh_kernel. */
static int vk_kernel_add(lmh_backend *b, const lmh_kernel_desc *desc, lmh_kernel **out, char *err,
                         size_t err_len) {
    *out = NULL;
    pthread_mutex_lock(&b->mu);
    int rc = LMH_OK;
    for (struct lmh_kernel *k = b->kernels; k; k = k->next)
        if (k->desc == desc) *out = k;
    if (*out) goto done;
    if (!desc || desc->size < offsetof(lmh_kernel_desc, spirv_bytes) + sizeof desc->spirv_bytes ||
        !desc->spirv || desc->spirv_bytes < 20 || desc->spirv_bytes % 4) {
        snprintf(err, err_len, "kernel '%s' has no SPIR-V for Vulkan",
                 desc && desc->name ? desc->name : "?");
        rc = LMH_EUNSUPPORTED;
        goto done;
    }
    /* what it asks of the device, from the module: more than the device gives is refused
     * here, as the kernel's own shortcoming, not passed to the driver */
    const char *name = desc->name ? desc->name : "?";
    vk_spirv_needs need;
    char why[160];
    if (vk_spirv_read(desc->spirv, desc->spirv_bytes, &need, why, sizeof why)) {
        snprintf(err, err_len, "kernel '%s': %s", name, why);
        rc = LMH_EINVAL;
        goto done;
    }
    const VkPhysicalDeviceLimits *lim = &b->props.limits;
    uint64_t inv = (uint64_t)need.local[0] * need.local[1] * need.local[2];
    if (need.shared_bytes > b->kernel_shared) {
        snprintf(err, err_len,
                 "kernel '%s' needs %llu bytes of shared memory a workgroup; the device gives %u",
                 name, (unsigned long long)need.shared_bytes, b->kernel_shared);
        rc = LMH_EUNSUPPORTED;
        goto done;
    }
    if (need.local[0] > lim->maxComputeWorkGroupSize[0] ||
        need.local[1] > lim->maxComputeWorkGroupSize[1] ||
        need.local[2] > lim->maxComputeWorkGroupSize[2] ||
        inv > lim->maxComputeWorkGroupInvocations) {
        snprintf(err, err_len,
                 "kernel '%s' has workgroups of %ux%ux%u; the device takes at most %ux%ux%u and "
                 "%u threads",
                 name, need.local[0], need.local[1], need.local[2], lim->maxComputeWorkGroupSize[0],
                 lim->maxComputeWorkGroupSize[1], lim->maxComputeWorkGroupSize[2],
                 lim->maxComputeWorkGroupInvocations);
        rc = LMH_EUNSUPPORTED;
        goto done;
    }
    struct lmh_kernel *k = calloc(1, sizeof *k);
    if (!k) {
        rc = LMH_ENOMEM;
        goto done;
    }
    VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                   .codeSize = desc->spirv_bytes,
                                   .pCode = desc->spirv};
    VkResult r = vkCreateShaderModule(b->dev, &mi, NULL, &k->module);
    if (r == VK_SUCCESS) {
        VkComputePipelineCreateInfo ci = {
            .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
            .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                      .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                      .module = k->module,
                      .pName = "main"},
            .layout = b->layout,
        };
        r = vkCreateComputePipelines(b->dev, VK_NULL_HANDLE, 1, &ci, NULL, &k->pipe);
        if (r != VK_SUCCESS) vkDestroyShaderModule(b->dev, k->module, NULL);
    }
    if (r != VK_SUCCESS) {
        snprintf(err, err_len, "kernel '%s': the device refused its SPIR-V (%s)", name,
                 vk_result_name(r));
        free(k);
        rc = LMH_EINVAL;
        goto done;
    }
    k->desc = desc;
    snprintf(k->name, sizeof k->name, "%s", name);
    k->next = b->kernels;
    b->kernels = k;
    *out = k;
done:
    pthread_mutex_unlock(&b->mu);
    return rc;
}

_Static_assert(LMH_KERNEL_MAX_TENSORS <= VK_NBIND && 8 + LMH_KERNEL_MAX_PARAMS <= VK_PC_WORDS,
               "a plugin kernel's tensors and params must fit the pipeline layout");

static int vk_kernel_run(lmh_backend *b, lmh_kernel *k, const lmh_kernel_call *call) {
    if (!k || !call || call->n_tensors > LMH_KERNEL_MAX_TENSORS) return LMH_EINVAL;
    vk_dispatch d = {.shader = VK_SH_PLUGIN, .pipe = k->pipe, .kernel = k, .writes = call->writes};
    for (uint32_t i = 0; i < call->n_tensors; i++) {
        if (!call->t[i] || !vk_bindable(b, call->t[i])) return LMH_EINVAL;
        d.bind[i] = VT(call->t[i]);
    }
    /* record() puts the offsets of bindings 0..4 in words 0..4; the rest are ours */
    for (uint32_t i = 5; i < call->n_tensors; i++) d.pc[i] = vk_elem_off(b, d.bind[i]);
    memcpy(d.pc + 8, call->params, sizeof call->params);
    d.pc_words = 8 + LMH_KERNEL_MAX_PARAMS;
    if (!call->groups) return LMH_OK;
    /* past 65535 workgroups, rows of a 2-D grid (the ABI says how a kernel numbers them) */
    vk_grid(&d, call->groups, b->kernel_grid_x);
    pthread_mutex_lock(&b->mu);
    vk_fuse_flush(b); /* held ops go first: the kernel may read what they write */
    int rc = b->err ? b->err : vk_fuse_take_err(b);
    if (!rc) rc = vk_record(b, &d);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* lmh_backend_api.compute_peak: the probe of the products' kind (vk_record_peak_probe) over
 * enough workgroups to keep a large GPU busy for about a millisecond a pass (a few on a CPU
 * device). */
static int vk_compute_peak(lmh_backend *b, double *flop_per_s, char *what, size_t what_len) {
    uint32_t groups = b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 64 : 16384;
    int64_t one = 4;
    lmh_tensor *dst = vk_tensor_new(b, LMH_F32, 1, &one, 0);
    double fps = 0;
    int rc = dst ? time_probe(b, &(vk_probe){NULL, VT(dst), groups}, rec_peak, &fps) : LMH_ENOMEM;
    vk_tensor_free(b, dst);
    if (!rc) rc = vk_sync(b);
    if (rc) return rc;
    *flop_per_s = fps;
    snprintf(what, what_len, "%s; best of 3",
             b->coopmat ? "f16 x f16 -> f32 16x16x16 cooperative matrices" : "f32 multiply-adds");
    return LMH_OK;
}

static const char *vk_describe(lmh_backend *b) {
    return b->desc;
}

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
        return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
        return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
        return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
        return "cpu";
    default:
        return "other";
    }
}

static int compute_family(VkPhysicalDevice pd, uint32_t *fam) {
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    VkQueueFamilyProperties qf[64];
    if (n > 64) n = 64;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, qf);
    for (uint32_t i = 0; i < n; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            *fam = i;
            return 1;
        }
    return 0;
}

static void vk_destroy(lmh_backend *b);

static VKAPI_ATTR VkBool32 VKAPI_CALL
on_validation(VkDebugUtilsMessageSeverityFlagBitsEXT sev, VkDebugUtilsMessageTypeFlagsEXT type,
              const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)type;
    lmh_backend *b = user;
    if (sev & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT |
               VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT)) {
        vk_log(b, LMH_LOG_ERROR, "validation: %s", data->pMessage);
        b->validation_errors++;
    }
    return VK_FALSE;
}

/* LMHOST_DEBUG's `key` as a number in lo..most, else dflt (with a warning where it is
 * given but not such a number). */
static uint32_t dbg_uint(lmh_backend *b, const char *key, uint32_t lo, uint32_t most,
                         uint32_t dflt) {
    char v[32], *end = NULL;
    if (!lmh_debug_get(key, v, sizeof v)) return dflt;
    unsigned long n = v[0] >= '0' && v[0] <= '9' ? strtoul(v, &end, 10) : 0;
    if (!end || *end || n < lo || n > most) {
        vk_log(b, LMH_LOG_WARN, "LMHOST_DEBUG %s=%s: not a number from %u to %u; %u it is", key, v,
               lo, most, dflt);
        return dflt;
    }
    return (uint32_t)n;
}

/* LMHOST_DEBUG's `key` as AxB, or A alone where b_opt (*bv then unchanged): 1 with both
 * in 1..most, 0 where absent, -1 (warned) where malformed. */
static int dbg_pair(lmh_backend *b, const char *key, int b_opt, unsigned most, unsigned *av,
                    unsigned *bv, const char *form) {
    char v[32], x;
    if (!lmh_debug_get(key, v, sizeof v)) return 0;
    unsigned a = 0, c = *bv;
    int n = sscanf(v, "%u%c%u%c", &a, &x, &c, &x);
    if ((n == 3 && x == 'x') || (n == 1 && b_opt)) {
        if (a >= 1 && a <= most && c >= 1 && c <= most) {
            *av = a;
            *bv = c;
            return 1;
        }
    }
    vk_log(b, LMH_LOG_WARN, "LMHOST_DEBUG %s=%s: want %s, each 1 to %u; the default stays", key, v,
           form, most);
    return -1;
}

static int has_device_ext(VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL);
    VkExtensionProperties *ep = calloc(n ? n : 1, sizeof *ep);
    int found = 0;
    if (ep && vkEnumerateDeviceExtensionProperties(pd, NULL, &n, ep) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = !strcmp(ep[i].extensionName, name);
    free(ep);
    return found;
}

/* Whether matmul_coop runs: in the fast precision mode (its f16 operands round at 2^-11:
 * see matmul_coop.comp), with the NV cooperative matrix extension in a 16x16x16
 * f16 x f16 -> f32 subgroup configuration, f16 arithmetic and subgroups of 32. (The KHR
 * form would serve as well, but Debian 12's glslang cannot compile shaders for it.) */
static int coopmat_usable(lmh_backend *b) {
    /* subgroups of 32, and up to 45 KB of shared memory (attn_coop.comp; matmul_coop.comp 44) */
    if (b->precision != LMH_PRECISION_FAST || b->subgroup_size != 32 || b->max_shared < 46080 ||
        !has_device_ext(b->pd, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME))
        return 0;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cmf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, .pNext = &cmf};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(b->pd, &f2);
    if (!cmf.cooperativeMatrix || !f12.shaderFloat16) return 0;
    PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV props =
        (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)(uintptr_t)vkGetInstanceProcAddr(
            b->inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
    uint32_t n = 0;
    if (!props || props(b->pd, &n, NULL) != VK_SUCCESS || n == 0 || n > 64) return 0;
    VkCooperativeMatrixPropertiesNV list[64];
    for (uint32_t i = 0; i < n; i++)
        list[i] = (VkCooperativeMatrixPropertiesNV){
            .sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV};
    if (props(b->pd, &n, list) != VK_SUCCESS) return 0;
    for (uint32_t i = 0; i < n; i++)
        if (list[i].MSize == 16 && list[i].NSize == 16 && list[i].KSize == 16 &&
            list[i].AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
            list[i].BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
            list[i].CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
            list[i].DType == VK_COMPONENT_TYPE_FLOAT32_NV && list[i].scope == VK_SCOPE_SUBGROUP_NV)
            return 1;
    return 0;
}

/* Decode attention of several sequences in one dispatch (attn_decode.comp with SEQS), and
 * several copies (copy_seqs.comp): they reach each tensor by device address. From how many
 * (LMHOST_DEBUG vk-attn-seqs=N, 0: never): 16 on a GPU, where attention of up to 8
 * sequences ran 0.6-1.3% slower so (README, H100), 2 on CPU devices. */
static uint32_t seq_attn_usable(lmh_backend *b) {
    uint32_t min = dbg_uint(b, "vk-attn-seqs", 0, 1 << 20,
                            b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 2 : 16);
    if (!min || !b->attn_dec_tpk) return 0;
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(b->pd, &f2);
    return f12.bufferDeviceAddress == VK_TRUE ? (min < 2 ? 2 : min) : 0;
}

static int has_layer(const char *name) {
    uint32_t n = 0;
    vkEnumerateInstanceLayerProperties(&n, NULL);
    VkLayerProperties *lp = calloc(n ? n : 1, sizeof *lp);
    int found = 0;
    if (lp && vkEnumerateInstanceLayerProperties(&n, lp) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = !strcmp(lp[i].layerName, name);
    free(lp);
    return found;
}

static int create_instance(lmh_backend *b, char *err, size_t err_len) {
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .pApplicationName = "lmhost",
                             .pEngineName = "lmhost",
                             .apiVersion = VK_API_VERSION_1_2};
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                .pApplicationInfo = &app};
    static const char *const layer = "VK_LAYER_KHRONOS_validation";
    static const char *const ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkValidationFeatureEnableEXT sync = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
    VkDebugUtilsMessengerCreateInfoEXT mi = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = on_validation,
        .pUserData = b};
    VkValidationFeaturesEXT vf = {.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
                                  .pNext = &mi,
                                  .enabledValidationFeatureCount = 1,
                                  .pEnabledValidationFeatures = &sync};
    /* LMHOST_DEBUG vk-validate: under the Khronos validation layer with synchronization
     * validation; every message it reports is logged as an error and makes the next sync
     * point fail, so tests cannot miss one */
    int validate = lmh_debug_on("vk-validate");
    if (validate && !has_layer(layer)) {
        vk_log(b, LMH_LOG_WARN, "LMHOST_DEBUG vk-validate: %s is not installed", layer);
        validate = 0;
    }
    if (validate) {
        ici.pNext = &vf;
        ici.enabledLayerCount = 1;
        ici.ppEnabledLayerNames = &layer;
        ici.enabledExtensionCount = 1;
        ici.ppEnabledExtensionNames = &ext;
    }
    VkResult r = vkCreateInstance(&ici, NULL, &b->inst);
    if (r != VK_SUCCESS) {
        b->inst = VK_NULL_HANDLE;
        snprintf(err, err_len, "cannot create a Vulkan instance (%s): no Vulkan driver?",
                 vk_result_name(r));
        return LMH_EUNSUPPORTED;
    }
    if (validate) {
        PFN_vkCreateDebugUtilsMessengerEXT fn =
            (PFN_vkCreateDebugUtilsMessengerEXT)(uintptr_t)vkGetInstanceProcAddr(
                b->inst, "vkCreateDebugUtilsMessengerEXT");
        if (!fn || fn(b->inst, &mi, NULL, &b->messenger) != VK_SUCCESS) {
            snprintf(err, err_len, "vk-validate: cannot install the debug messenger");
            return LMH_EUNSUPPORTED;
        }
    }
    return LMH_OK;
}

static int setup_device(lmh_backend *b, int32_t want, char *err, size_t err_len) {
    int rc = create_instance(b, err, err_len);
    if (rc != LMH_OK) return rc;
    VkResult r;
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(b->inst, &n, NULL);
    VkPhysicalDevice all[16];
    if (n > 16) n = 16;
    if (n) vkEnumeratePhysicalDevices(b->inst, &n, all);
    /* the devices this backend can use: Vulkan 1.2 with a compute queue */
    int usable = 0, chosen = -1;
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(all[i], &p);
        uint32_t fam;
        if (p.apiVersion < VK_API_VERSION_1_2 || !compute_family(all[i], &fam)) {
            vk_log(b, LMH_LOG_INFO, "skipping %s (Vulkan %u.%u, or no compute queue)", p.deviceName,
                   VK_API_VERSION_MAJOR(p.apiVersion), VK_API_VERSION_MINOR(p.apiVersion));
            continue;
        }
        VkPhysicalDeviceMemoryProperties mp;
        vkGetPhysicalDeviceMemoryProperties(all[i], &mp);
        uint32_t hi = 0;
        VkDeviceSize heap = local_heap(&mp, &hi);
        vk_log(b, LMH_LOG_INFO, "device %d: %s (%s, Vulkan %u.%u.%u, %.1f GiB)%s", usable,
               p.deviceName, type_name(p.deviceType), VK_API_VERSION_MAJOR(p.apiVersion),
               VK_API_VERSION_MINOR(p.apiVersion), VK_API_VERSION_PATCH(p.apiVersion),
               (double)heap / (double)(1 << 30), usable == want ? " <- selected" : "");
        if (usable == want) {
            chosen = (int)i;
            b->qfam = fam;
        }
        usable++;
    }
    if (chosen < 0) {
        snprintf(err, err_len,
                 "Vulkan device %d requested; %d usable device%s (Vulkan 1.2 with compute)", want,
                 usable, usable == 1 ? "" : "s");
        return LMH_ENOTFOUND;
    }
    b->pd = all[chosen];
    vkGetPhysicalDeviceProperties(b->pd, &b->props);
    vkGetPhysicalDeviceMemoryProperties(b->pd, &b->mem);
    VkPhysicalDeviceMaintenance3Properties m3 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
    /* the smallest subgroup a shader may run in, where a device compiles to several sizes
     * (VK_EXT_subgroup_size_control: the instance asks for Vulkan 1.2, so the core 1.3
     * struct may be chained only through the extension) */
    VkPhysicalDeviceSubgroupSizeControlPropertiesEXT sgc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES_EXT};
    if (has_device_ext(b->pd, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME)) m3.pNext = &sgc;
    VkPhysicalDeviceSubgroupProperties sg = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, .pNext = &m3};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                      .pNext = &sg};
    vkGetPhysicalDeviceProperties2(b->pd, &p2);
    b->max_alloc = m3.maxMemoryAllocationSize ? m3.maxMemoryAllocationSize : BLOCK_MAX;
    /* subgroup operations in compute shaders, unless LMHOST_DEBUG vk-no-subgroup turns them
     * off (tests of the shared-memory reductions) */
    int sg_ok = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                (sg.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) &&
                !lmh_debug_on("vk-no-subgroup");
    b->subgroup_size = sg.subgroupSize;
    b->subgroup_arith = sg_ok && (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
    /* vk-no-fuse: every op a dispatch of its own, nothing fused or put off (vk_fuse.c), for
     * tests and measurement */
    b->no_fuse = lmh_debug_on("vk-no-fuse");
    /* Norm and SwiGLU inside the products: every workgroup redoes that work, which a GPU
     * hides behind its weight loads and a CPU device pays in full (2.2x slower decode on
     * lavapipe). vk-fuse-products[=0|1]: either way (the tests run a GPU's on lavapipe). */
    char fp[8];
    b->fuse_products = lmh_debug_get("vk-fuse-products", fp, sizeof fp)
                           ? strcmp(fp, "0") != 0
                           : b->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU;
    /* vk-matvec=WGxNR: the matrix-vector workgroup of the f32/f16/bf16 products, threads
     * (a power of two, 32 to 256) and output columns (1 to 8), for measurement (the
     * 8-row variant's sums in shared memory must fit: 256x8 made a device lost) */
    unsigned mv_wg = 0, mv_nr = 0;
    if (dbg_pair(b, "vk-matvec", 0, 256, &mv_wg, &mv_nr, "WGxNR") == 1 &&
        (mv_wg < 32 || (mv_wg & (mv_wg - 1)) || mv_nr > 8 ||
         4 * mv_wg * mv_nr * 8 > b->props.limits.maxComputeSharedMemorySize)) {
        vk_log(b, LMH_LOG_WARN,
               "LMHOST_DEBUG vk-matvec=%ux%u: threads a power of two from 32 to 256, up to 8 "
               "columns, within the device's shared memory; the default stays",
               mv_wg, mv_nr);
        mv_wg = 0;
    }
    /* A CPU device pays for every workgroup: lavapipe took 27 ms for one row through a
     * 151936 x 64 head (76k workgroups of 128 threads, 2 columns each), a 3-7x slower
     * decode than with 64 threads and 8 columns (the same sums for a column either way) */
    int cpu_dev = b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU &&
                  4u * MATVEC_WG * 8u * 8u <= b->props.limits.maxComputeSharedMemorySize;
    if (!mv_wg) mv_nr = cpu_dev ? 8 : MATVEC_NR;
    b->matvec_wg = mv_wg ? mv_wg : MATVEC_WG;
    b->matvec1_wg = mv_wg ? mv_wg : cpu_dev ? MATVEC_WG : MATVEC1_WG;
    b->matvec_nr = mv_nr;
    b->matvec8_nr = mv_wg ? mv_nr : MATVEC8_NR;
    /* On GPUs products of up to 16 rows read their weights as matrix-vector ones, 8 rows a
     * workgroup (from 17 rows matmul_big.comp's tiles, split over k, were faster: H100,
     * README); a CPU device takes tiles past 4 rows (lavapipe's compiler takes long over
     * matvec8's unrolled rows: the op test's quantized products 44 instead of 4 s, mostly
     * building pipelines). vk-matvec-rows=N (N >= 4) moves the limit, for tests and
     * measurement. */
    b->matvec_rows = dbg_uint(b, "vk-matvec-rows", 4, 1 << 20,
                              b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 4 : MATVEC_ROWS);
    /* vk-full-barriers: every barrier takes all stages and accesses (the form before
     * compute-only barriers), for measurement */
    b->full_barriers = lmh_debug_on("vk-full-barriers");
    /* Waits poll the fence before they sleep: woken by the driver, a decode step's wait for
     * its logits left the GPU idle for about 0.25 ms a token (README, H100). Not on a CPU
     * device, whose threads the poll would take a core from. Option spin=US. */
    b->spin_us = b->opt_spin >= 0                                     ? (uint32_t)b->opt_spin
                 : b->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU ? SPIN_US
                                                                      : 0;
    /* vk-submit-min=N: the dispatches a batch holds before an idle device gets it */
    b->submit_min = (int)dbg_uint(b, "vk-submit-min", 1, MAX_DISPATCH, SUBMIT_MIN);
    b->profile =
        b->opt_profile > 0 && b->props.limits.timestampComputeAndGraphics ? b->opt_profile : 0;
    if (b->opt_profile > 0 && !b->profile)
        vk_log(b, LMH_LOG_WARN, "profile=%d: %s has no timestamps in compute queues",
               b->opt_profile, b->props.deviceName);
    const VkPhysicalDeviceLimits *lim = &b->props.limits;
    /* matmul_big.comp past the matrix-vector kernels' rows (not on a CPU device, where its
     * 64 sums a thread ran 4x slower than matmul.comp's 16); vk-matmul-big=0|1|4|8: never,
     * or for every product past the matrix-vector kernels' rows (tests), 4 and 8 with that
     * many rows a thread whatever the shape */
    uint32_t mb = dbg_uint(b, "vk-matmul-big", 0, 8, UINT32_MAX);
    if (mb != UINT32_MAX && mb != 0 && mb != 1 && mb != 4 && mb != 8) {
        vk_log(b, LMH_LOG_WARN, "LMHOST_DEBUG vk-matmul-big=%u: want 0, 1, 4 or 8", mb);
        mb = UINT32_MAX;
    }
    if (mb != UINT32_MAX) {
        b->matmul_big = mb ? 1 : 0;
        b->matmul_tm = mb == 4 || mb == 8 ? mb : 0;
    } else {
        b->matmul_big = b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 0 : BIG_MIN_ROWS;
    }
    /* SSD_SCAN and DELTA_RULE chunked from SCAN_CHUNK rows (H200: at 64 rows the delta
     * rule's chunked form took 10-25% longer than row by row, SSD's as long; at 128 they
     * took 20-30% and 12% less; at 4096, 44-49% and 35-43% of the time);
     * vk-scan-chunk=N[:C] from N rows, 0 never, C chunks of 64 rows a pass at most (default:
     * as many as 64 MiB of scratch holds), for tests of either form at any length */
    b->scan_chunk = SCAN_CHUNK;
    b->scan_seg = 0;
    char sc[32];
    if (lmh_debug_get("vk-scan-chunk", sc, sizeof sc)) {
        char *e1 = NULL, *e2 = NULL;
        unsigned long n = sc[0] >= '0' && sc[0] <= '9' ? strtoul(sc, &e1, 10) : 0;
        unsigned long c =
            e1 && *e1 == ':' && e1[1] >= '0' && e1[1] <= '9' ? strtoul(e1 + 1, &e2, 10) : 0;
        if (e1 && (!*e1 || (e2 && !*e2)) && n <= 1u << 30 && c <= 1u << 20) {
            b->scan_chunk = (uint32_t)n;
            b->scan_seg = (uint32_t)c;
        } else {
            vk_log(b, LMH_LOG_WARN,
                   "LMHOST_DEBUG vk-scan-chunk=%s: want N or N:C; the default stays", sc);
        }
    }
    b->argmax_wg = 1024;
    while (b->argmax_wg > 256 && (b->argmax_wg > lim->maxComputeWorkGroupInvocations ||
                                  b->argmax_wg > lim->maxComputeWorkGroupSize[0] ||
                                  8 * b->argmax_wg > lim->maxComputeSharedMemorySize))
        b->argmax_wg /= 2;
    b->align =
        lim->minStorageBufferOffsetAlignment > 16 ? lim->minStorageBufferOffsetAlignment : 16;
    b->max_range = lim->maxStorageBufferRange;
    b->max_shared = lim->maxComputeSharedMemorySize;
    /* vk-kernel-shared=N: plugin kernels get at most N bytes of it, as on a smaller device
     * (tests of a plugin's way around a refused kernel) */
    b->kernel_shared = dbg_uint(b, "vk-kernel-shared", 1, b->max_shared, b->max_shared);
    /* vk-kernel-grid-x=N: plugin kernels' grids take rows past N workgroups (65535, the
     * least a device offers a dimension), so a test reaches that path with a small input */
    b->kernel_grid_x = dbg_uint(b, "vk-kernel-grid-x", 1, 65535, 65535);
    /* vk-attn-wgs=N (1..512, the counters' room): a GPU's split counts on lavapipe */
    b->attn_target_wgs = dbg_uint(b, "vk-attn-wgs", 1, 512,
                                  b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 8 : 512);
    /* attention's loads issued together (attention.comp): a GPU's or one at a time;
     * vk-attn-unroll=KUxVU (1 to 64 each) sets them, for tests and measurement */
    unsigned ku = 0, vu = 0;
    if (dbg_pair(b, "vk-attn-unroll", 0, 64, &ku, &vu, "KUxVU") != 1) {
        int cpu = b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
        /* prefill at 4K on an H100: 16x16 4.69 ms a layer, 64x32 4.95, 8x8 4.97 */
        ku = cpu ? 1 : 16;
        vu = cpu ? 1 : 16;
    }
    b->attn_ku = ku;
    b->attn_vu = vu;
    /* the decode kernel: a key's lanes within one subgroup of the smallest size a shader
     * may get (8 where the device does not say), 16 at most (measured best on an H100
     * beside 8 and 32); vk-attn-decode=0 leaves decode to attention.comp, =KU[xTPK] sets
     * how many keys a key group loads together (1 to 8) and its lanes (a power of two), for
     * measurement */
    char ad[32];
    int ad_off = lmh_debug_get("vk-attn-decode", ad, sizeof ad) && !strcmp(ad, "0");
    int shuffle = sg_ok && (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
    unsigned dku = 0, dtpk = 16;
    if (!ad_off && dbg_pair(b, "vk-attn-decode", 1, 64, &dku, &dtpk, "0 or KU[xTPK]") == 1 &&
        (dku > 8 || (dtpk & (dtpk - 1)))) {
        vk_log(b, LMH_LOG_WARN,
               "LMHOST_DEBUG vk-attn-decode=%s: KU 1 to 8, TPK a power of two; the default stays",
               ad);
        dku = 0, dtpk = 16;
    }
    uint32_t sg_min = sgc.minSubgroupSize ? sgc.minSubgroupSize : sg.subgroupSize;
    if (!sgc.minSubgroupSize && sg_min > 8) sg_min = 8;
    b->attn_dec_tpk = shuffle && !ad_off && sg_min ? (sg_min < dtpk ? sg_min : dtpk) : 0;
    /* vk-attn-dec-wgs=N and vk-attn-seq-wgs=N: the workgroups the decode kernel's key splits
     * aim for (half attention's) and those of several sequences' decode attention in one
     * dispatch (twice that; past it a workgroup takes several key splits in turn) */
    b->attn_dec_wgs = dbg_uint(b, "vk-attn-dec-wgs", 1, 4096, (b->attn_target_wgs + 1) / 2);
    b->attn_seq_wgs = dbg_uint(b, "vk-attn-seq-wgs", 1, 1 << 20, 2 * b->attn_dec_wgs);
    b->attn_dec_ku = dku ? dku : (b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 1 : 2);
    if ((b->align & (b->align - 1)) || lim->maxPushConstantsSize < VK_PC_WORDS * 4 ||
        lim->maxComputeWorkGroupInvocations < 256 || lim->maxComputeWorkGroupSize[0] < 256 ||
        b->max_shared < 16384) {
        snprintf(err, err_len, "%s: unsupported limits (push constants %u, workgroup %u)",
                 b->props.deviceName, lim->maxPushConstantsSize,
                 lim->maxComputeWorkGroupInvocations);
        return LMH_EUNSUPPORTED;
    }

    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                  .queueFamilyIndex = b->qfam,
                                  .queueCount = 1,
                                  .pQueuePriorities = &prio};
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                             .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &qi};
    const char *exts[3];
    uint32_t next = 0;
    /* VK_KHR_push_descriptor where the device has it, unless LMHOST_DEBUG
     * vk-no-push-descriptor asks for descriptor pools (tests of that path) */
    int push = has_device_ext(b->pd, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME) &&
               !lmh_debug_on("vk-no-push-descriptor");
    if (push) exts[next++] = VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME;
    /* Matrix cores for prefill: f16 products into f32 in subgroups of 32 (matmul_coop). */
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cmf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
        .cooperativeMatrix = VK_TRUE};
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    /* the precision mode: as asked, else exact on CPU devices (lavapipe: nothing to gain)
     * and fast on GPUs */
    if (!b->precision)
        b->precision = b->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? LMH_PRECISION_EXACT
                                                                          : LMH_PRECISION_FAST;
    b->coopmat = coopmat_usable(b);
    /* fast arithmetic here is the matrix cores': without them the mode runs exact */
    if (b->precision == LMH_PRECISION_FAST && !b->coopmat) {
        vk_log(b, LMH_LOG_INFO, "precision fast: no matrix cores this backend can use, exact");
        b->precision = LMH_PRECISION_EXACT;
    }
    /* and prefill attention there (attn_coop.comp), which takes its rows' softmax across a
     * subgroup */
    uint32_t attn_ops = VK_SUBGROUP_FEATURE_ARITHMETIC_BIT | VK_SUBGROUP_FEATURE_SHUFFLE_BIT |
                        VK_SUBGROUP_FEATURE_VOTE_BIT;
    b->attn_coop = b->coopmat && sg_ok && (sg.supportedOperations & attn_ops) == attn_ops;
    b->seq_attn = seq_attn_usable(b);
    f12.shaderFloat16 = b->coopmat ? VK_TRUE : VK_FALSE;
    f12.bufferDeviceAddress = b->seq_attn ? VK_TRUE : VK_FALSE;
    void *chain = b->coopmat || b->seq_attn ? &f12 : NULL;
    if (b->coopmat) {
        exts[next++] = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
        cmf.pNext = chain;
        chain = &cmf;
    }
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR pef = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
        .pipelineExecutableInfo = VK_TRUE};
    b->pipe_stats =
        b->profile && has_device_ext(b->pd, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    if (b->pipe_stats) {
        exts[next++] = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
        pef.pNext = chain;
        chain = &pef;
    }
    di.pNext = chain;
    di.enabledExtensionCount = next;
    di.ppEnabledExtensionNames = next ? exts : NULL;
    r = vkCreateDevice(b->pd, &di, NULL, &b->dev);
    if (r != VK_SUCCESS) {
        b->dev = VK_NULL_HANDLE;
        snprintf(err, err_len, "vkCreateDevice on %s: %s", b->props.deviceName, vk_result_name(r));
        return LMH_EIO;
    }
    vkGetDeviceQueue(b->dev, b->qfam, 0, &b->queue);
    if (push)
        b->push_set = (PFN_vkCmdPushDescriptorSetKHR)(uintptr_t)vkGetDeviceProcAddr(
            b->dev, "vkCmdPushDescriptorSetKHR");
    snprintf(b->desc, sizeof b->desc, "%s (%s, Vulkan %u.%u.%u, subgroup %u%s%s%s%s)",
             b->props.deviceName, type_name(b->props.deviceType),
             VK_API_VERSION_MAJOR(b->props.apiVersion), VK_API_VERSION_MINOR(b->props.apiVersion),
             VK_API_VERSION_PATCH(b->props.apiVersion), b->subgroup_size,
             b->subgroup_arith ? " reductions" : ", shared-memory reductions",
             b->push_set ? ", push descriptors" : "", b->seq_attn ? ", buffer addresses" : "",
             b->coopmat ? ", matrix cores" : "");
    return LMH_OK;
}

static int setup_objects(lmh_backend *b, char *err, size_t err_len) {
    VkDescriptorSetLayoutBinding lb[VK_NBIND];
    for (uint32_t i = 0; i < VK_NBIND; i++)
        lb[i] = (VkDescriptorSetLayoutBinding){i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                               VK_SHADER_STAGE_COMPUTE_BIT, NULL};
    VkDescriptorSetLayoutCreateInfo li = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
        .flags = b->push_set ? VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR : 0,
        .bindingCount = VK_NBIND,
        .pBindings = lb};
    VkResult r = vkCreateDescriptorSetLayout(b->dev, &li, NULL, &b->dsl);
    VkPushConstantRange pr = {VK_SHADER_STAGE_COMPUTE_BIT, 0, VK_PC_WORDS * 4};
    VkPipelineLayoutCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                     .setLayoutCount = 1,
                                     .pSetLayouts = &b->dsl,
                                     .pushConstantRangeCount = 1,
                                     .pPushConstantRanges = &pr};
    if (r == VK_SUCCESS) r = vkCreatePipelineLayout(b->dev, &pi, NULL, &b->layout);
    VkCommandPoolCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                  .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                  .queueFamilyIndex = b->qfam};
    if (r == VK_SUCCESS) r = vkCreateCommandPool(b->dev, &ci, NULL, &b->cmdpool);
    for (int i = 0; i < VK_NBATCH && r == VK_SUCCESS; i++) {
        VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                          .commandPool = b->cmdpool,
                                          .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                          .commandBufferCount = 1};
        r = vkAllocateCommandBuffers(b->dev, &ai, &b->batch[i].cb);
        VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        if (r == VK_SUCCESS) r = vkCreateFence(b->dev, &fi, NULL, &b->batch[i].fence);
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                    .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                    .queryCount = 2 * MAX_DISPATCH};
        if (r == VK_SUCCESS && b->profile) {
            b->batch[i].query_shader = calloc(MAX_DISPATCH, 1);
            b->batch[i].query_groups = calloc(MAX_DISPATCH, sizeof(uint32_t));
            b->batch[i].query_kernel = calloc(MAX_DISPATCH, sizeof(struct lmh_kernel *));
            b->batch[i].steps = calloc(2 * MAX_DISPATCH, sizeof(vk_step));
            r = b->batch[i].query_shader && b->batch[i].query_groups && b->batch[i].query_kernel &&
                        b->batch[i].steps
                    ? vkCreateQueryPool(b->dev, &qi, NULL, &b->batch[i].queries)
                    : VK_ERROR_OUT_OF_HOST_MEMORY;
        }
    }
    if (r != VK_SUCCESS) {
        snprintf(err, err_len, "setting up %s: %s", b->props.deviceName, vk_result_name(r));
        return LMH_EIO;
    }
    b->dummy = vk_scratch(b, 256);
    if (!b->dummy) {
        snprintf(err, err_len, "cannot allocate device memory on %s", b->props.deviceName);
        return LMH_ENOMEM;
    }
    b->other_bytes -= b->dummy->bytes;
    /* attention's split counters (attention.comp, attn_decode.comp), zero between
     * dispatches: VK_ATTN_CNT_SLOTS sets of attn_target_wgs, taken in turn, so that the
     * attention of several sequences in one step (batched decode) has no counter in common
     * and needs no barrier between them */
    int64_t cnt_words = (int64_t)b->attn_target_wgs;
    /* sets apart by whole binding alignments, or their bound ranges would overlap */
    size_t cnt_bytes = (4 * (size_t)cnt_words + b->align - 1) & ~(size_t)(b->align - 1);
    uint8_t *zeros = calloc(VK_ATTN_CNT_SLOTS, cnt_bytes);
    b->attn_cnt = zeros ? vk_scratch(b, cnt_bytes * VK_ATTN_CNT_SLOTS) : NULL;
    for (int i = 0; b->attn_cnt && i < VK_ATTN_CNT_SLOTS; i++) {
        vk_tensor *t = b->attn_slot[i] = tensor_make(LMH_U32, 1, &cnt_words);
        if (!t) break;
        t->a = b->attn_cnt->a;
        t->off = b->attn_cnt->off + (VkDeviceSize)i * cnt_bytes;
    }
    int bad = !b->attn_cnt || !b->attn_slot[VK_ATTN_CNT_SLOTS - 1] ||
              upload_locked(b, b->attn_cnt, 0, zeros, cnt_bytes * VK_ATTN_CNT_SLOTS) || wait_all(b);
    free(zeros);
    if (bad) {
        snprintf(err, err_len, "cannot set up device memory on %s", b->props.deviceName);
        return b->err ? b->err : LMH_ENOMEM;
    }
    b->other_bytes -= b->attn_cnt->bytes;
    return LMH_OK;
}

/* The backend's options (lmh_backend_opts.params), each as "key=value". */
static const char *const vk_params[][2] = {
    {"device", "device=N"},
    {"max-memory", "max-memory=N[K|M|G]"},
    {"profile", "profile=0|1|2|3"},
    {"spin", "spin=US"},
};

/* Reads the options into b (and *device); LMH_EINVAL with err naming what is wrong and
 * the options there are. */
static int parse_params(lmh_backend *b, const char *params, int32_t *device, char *err,
                        size_t err_len) {
    char key[32], val[64];
    while (lmh_kv_next(&params, key, sizeof key, val, sizeof val)) {
        char *end = NULL;
        unsigned long n = val[0] >= '0' && val[0] <= '9' ? strtoul(val, &end, 10) : 0;
        int num = end && !*end, ok = 1, known = -1;
        for (int i = 0; i < (int)(sizeof vk_params / sizeof vk_params[0]); i++)
            if (!strcmp(key, vk_params[i][0])) known = i;
        if (known == 0 && (ok = num && n < 16))
            *device = (int32_t)n;
        else if (known == 1 && (ok = mem_cap(val) > 0))
            b->max_memory = (VkDeviceSize)mem_cap(val);
        else if (known == 2 && (ok = num && n <= 3))
            b->opt_profile = (int)n;
        else if (known == 3 && (ok = num && n <= 1000000)) /* a second at most */
            b->opt_spin = (long)n;
        if (known < 0) {
            int o = snprintf(err, err_len, "unknown option '%s' (known:", key);
            for (int i = 0; i < (int)(sizeof vk_params / sizeof vk_params[0]); i++)
                if (o >= 0 && (size_t)o < err_len)
                    o += snprintf(err + o, err_len - (size_t)o, "%s %s", i ? "," : "",
                                  vk_params[i][1]);
            if (o >= 0 && (size_t)o < err_len) snprintf(err + o, err_len - (size_t)o, ")");
            return LMH_EINVAL;
        }
        if (!ok) {
            snprintf(err, err_len, "option %s=%s: want %s%s", key, val, vk_params[known][1],
                     known == 1   ? " (bytes, or a number with K, M or G)"
                     : known == 3 ? " (microseconds, up to 1000000)"
                                  : "");
            return LMH_EINVAL;
        }
    }
    return LMH_OK;
}

static int vk_create(const lmh_host_api *host, const lmh_backend_opts *o, lmh_backend **out,
                     char *err, size_t err_len) {
    lmh_backend *b = calloc(1, sizeof *b);
    if (!b) return LMH_ENOMEM;
    b->host = host;
    b->cur = -1;
    b->last = VK_NBATCH - 1;
    b->opt_profile = -1;
    b->opt_spin = -1;
    pthread_mutex_init(&b->mu, NULL);
    int32_t want = 0;
    if (o && o->size >= offsetof(lmh_backend_opts, device) + sizeof o->device) want = o->device;
    b->precision = lmh_opts_precision(o) == LMH_PRECISION_FAST    ? LMH_PRECISION_FAST
                   : lmh_opts_precision(o) == LMH_PRECISION_EXACT ? LMH_PRECISION_EXACT
                                                                  : 0;
    if (parse_params(b, lmh_opts_params(o), &want, err, err_len) != LMH_OK) {
        vk_destroy(b);
        return LMH_EINVAL;
    }
    int rc = setup_device(b, want, err, err_len);
    if (rc == LMH_OK) rc = setup_objects(b, err, err_len);
    if (rc != LMH_OK) {
        vk_destroy(b);
        return rc;
    }
    vk_log(b, LMH_LOG_INFO, "%s", b->desc);
    *out = b;
    return LMH_OK;
}

static int32_t vk_precision(lmh_backend *b) {
    return b->precision;
}

/* profile=3 at destroy: each kind of step, the largest total first */
static void log_steps(lmh_backend *b) {
    for (int done = 0; done < b->nprof_step; done++) {
        int k = done;
        for (int i = done + 1; i < b->nprof_step; i++)
            if (b->prof_step[i].us > b->prof_step[k].us) k = i;
        if (k != done) {
            vk_step_time t = b->prof_step[k];
            b->prof_step[k] = b->prof_step[done];
            b->prof_step[done] = t;
        }
        const vk_step *st = &b->prof_step[done].s;
        char what[256];
        int o = snprintf(what, sizeof what, "%s", st->heavy ? " after a full barrier:" : "");
        for (int i = 0; i < st->n && i < STEP_NAMED && o < (int)sizeof what; i++)
            o += snprintf(what + o, sizeof what - (size_t)o, " %s/%u",
                          vk_shaders[st->shader[i]].name, st->groups[i]);
        if (st->n > STEP_NAMED && o < (int)sizeof what)
            o += snprintf(what + o, sizeof what - (size_t)o, " and %d more", st->n - STEP_NAMED);
        if (st->copies && o < (int)sizeof what)
            snprintf(what + o, sizeof what - (size_t)o, " +%d copies", st->copies);
        vk_log(b, LMH_LOG_INFO, "profile: step %8llu x %9.2f us = %10.3f ms:%s",
               (unsigned long long)b->prof_step[done].n,
               b->prof_step[done].us / (double)b->prof_step[done].n, b->prof_step[done].us * 1e-3,
               st->n || st->copies ? what : " (nothing recorded)");
    }
}

/* A scratch tensor the backend keeps: its record and its allocation's (the memory block goes
 * with the others, freed below in vk_destroy). */
static void free_kept(vk_tensor *t) {
    if (!t) return;
    free(t->a);
    free(t);
}

static void vk_destroy(lmh_backend *b) {
    if (!b) return;
    if (b->dev) {
        vk_fuse_flush(b);
        if (!b->err) wait_all(b);
        vkDeviceWaitIdle(b->dev);
        for (int i = 0; i < b->ndefer; i++) free(b->defer[i]);
        free_kept(b->dummy);
        for (int i = 0; i < VK_ATTN_CNT_SLOTS; i++) free(b->attn_slot[i]); /* views */
        for (int i = 0; i < VK_SPLIT_SLOTS; i++) free_kept(b->split_room[i]);
        free_kept(b->scan_room);
        free_kept(b->attn_cnt);
        if (b->profile) {
            double total = 0;
            for (int i = 0; i < VK_SH_COUNT; i++) total += b->prof_us[i];
            if (b->profile < 3)
                vk_log(b, LMH_LOG_INFO, "profile: %.3f ms of GPU time in dispatches", total * 1e-3);
            vk_log(b, LMH_LOG_INFO,
                   "profile: host %.3f ms recording, %.3f ms waiting for the device; "
                   "%llu submits",
                   b->prof_record_s * 1e3, b->prof_wait_s * 1e3,
                   (unsigned long long)b->prof_submits);
            if (b->profile == 3)
                vk_log(b, LMH_LOG_INFO,
                       "profile: the device idle %.3f ms between batches (%llu gaps under 1 ms)",
                       b->prof_gap_us * 1e-3, (unsigned long long)b->prof_gaps);
            for (int i = 0; i < VK_SH_COUNT; i++)
                if (b->prof_n[i])
                    vk_log(b, LMH_LOG_INFO,
                           "profile: %-13s %8llu dispatches %10.3f ms %8.2f us each",
                           vk_shaders[i].name, (unsigned long long)b->prof_n[i],
                           b->prof_us[i] * 1e-3, b->prof_us[i] / (double)b->prof_n[i]);
            for (const struct lmh_kernel *k = b->kernels; k; k = k->next)
                if (k->prof_n)
                    vk_log(b, LMH_LOG_INFO,
                           "profile: plugin kernel '%s' %llu dispatches %.3f ms %.2f us each",
                           k->name, (unsigned long long)k->prof_n, k->prof_us * 1e-3,
                           k->prof_us / (double)k->prof_n);
            for (int k = 0; k < b->nprof_shape; k++)
                vk_log(b, LMH_LOG_INFO,
                       "profile: %-13s %8u workgroups %8llu dispatches %10.3f ms %8.2f us each",
                       vk_shaders[b->prof_shape[k].shader].name, b->prof_shape[k].groups,
                       (unsigned long long)b->prof_shape[k].n, b->prof_shape[k].us * 1e-3,
                       b->prof_shape[k].us / (double)b->prof_shape[k].n);
            log_steps(b);
        }
        for (int i = 0; i < b->npipes; i++) vkDestroyPipeline(b->dev, b->pipes[i].p, NULL);
        while (b->kernels) {
            struct lmh_kernel *k = b->kernels;
            b->kernels = k->next;
            vkDestroyPipeline(b->dev, k->pipe, NULL);
            vkDestroyShaderModule(b->dev, k->module, NULL);
            free(k);
        }
        for (int i = 0; i < VK_SH_COUNT; i++)
            if (b->modules[i]) vkDestroyShaderModule(b->dev, b->modules[i], NULL);
        for (int i = 0; i < VK_NBATCH; i++) {
            vk_batch *bt = &b->batch[i];
            for (int p = 0; p < bt->npools; p++)
                vkDestroyDescriptorPool(b->dev, bt->pools[p], NULL);
            free(bt->pools);
            if (bt->fence) vkDestroyFence(b->dev, bt->fence, NULL);
            if (bt->queries) vkDestroyQueryPool(b->dev, bt->queries, NULL);
            free(bt->query_shader);
            free(bt->steps);
            free(bt->query_groups);
            free(bt->query_kernel);
            hostbuf_free(b, &bt->staging);
            if (bt->stats_t) free(bt->stats_t->a);
            free(bt->stats_t);
            block_destroy(b, bt->stats);
            free(bt->args_a);
            block_destroy(b, bt->args);
            free(bt->moe);
        }
        if (b->cmdpool) vkDestroyCommandPool(b->dev, b->cmdpool, NULL);
        if (b->layout) vkDestroyPipelineLayout(b->dev, b->layout, NULL);
        if (b->dsl) vkDestroyDescriptorSetLayout(b->dev, b->dsl, NULL);
        hostbuf_free(b, &b->readback);
        for (int i = 0; i < VK_NREAD; i++) hostbuf_free(b, &b->reads[i].buf);
        for (int i = 0; i < b->nblocks; i++) block_destroy(b, b->blocks[i]);
        vkDestroyDevice(b->dev, NULL);
    }
    if (b->messenger) {
        PFN_vkDestroyDebugUtilsMessengerEXT fn =
            (PFN_vkDestroyDebugUtilsMessengerEXT)(uintptr_t)vkGetInstanceProcAddr(
                b->inst, "vkDestroyDebugUtilsMessengerEXT");
        if (fn) fn(b->inst, b->messenger, NULL);
    }
    if (b->inst) vkDestroyInstance(b->inst, NULL);
    free(b->blocks);
    free(b->pipes);
    free(b->defer);
    free(b->rd);
    free(b->hseq);
    for (int k = 0; k < 5; k++) free(b->hrng[k]);
    free(b->wr);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

static int vk_init(const lmh_host_api *host, char *err, size_t err_len) {
    (void)err;
    (void)err_len;
    g_host = host;
    return 0;
}

static const char *const weight_dtypes[] = {"f32", "f16", "bf16", "q2",    "q3", "q4",
                                            "q5",  "q6",  "q8",   "mxfp4", NULL};
static const char *const ops[] = {
    "get_rows",   "matmul",      "rms_norm",    "add",          "mul",       "scale",
    "swiglu",     "geglu",       "rope",        "copy",         "attention", "softcap",
    "moe_route",  "moe_matmul",  "moe_combine", "sigmoid_gate", "transpose", "argmax",
    "cols",       "unary",       "conv1d",      "ssm_scan",     "ssd_scan",  "delta_rule",
    "swiglu_oai", "rope_switch", NULL};

static const lmh_backend_api api = {
    .size = sizeof(lmh_backend_api),
    .weight_dtypes = weight_dtypes,
    .ops = ops,
    .create = vk_create,
    .destroy = vk_destroy,
    .describe = vk_describe,
    .supports = vk_supports,
    .tensor_new = vk_tensor_new,
    .tensor_wrap = NULL, /* device memory: the host uses tensor_new + upload */
    .tensor_view = vk_tensor_view,
    .tensor_free = vk_tensor_free,
    .upload = vk_upload,
    .download = vk_download,
    .enqueue = vk_enqueue,
    .sync = vk_sync,
    .memory = vk_memory,
    .tensor_quant = vk_tensor_quant,
    .read_bandwidth = vk_read_bandwidth,
    .compute_peak = vk_compute_peak,
    .download_start = vk_download_start,
    .download_wait = vk_download_wait,
    .kernel_add = vk_kernel_add,
    .kernel_run = vk_kernel_run,
    .precision = vk_precision,
    .device_memory = vk_device_memory,
    .tensor_quant_write = vk_tensor_quant_write,
};

static const lmh_plugin_info info = {
    LMH_PLUGIN_HEADER,
    .kind = LMH_KIND_BACKEND,
    .name = "vulkan",
    .version = "0.1.0",
    .summary = "Vulkan 1.2 compute (any GPU, or lavapipe); f32 compute over f32/f16/bf16 "
               "and MLX-quantized (2..8-bit) weights; --device N picks the GPU",
    .init = vk_init,
    .api = &api,
};

LMH_EXPORT const lmh_plugin_info *lmhost_plugin_entry(void) {
    return &info;
}
