/* A reader of the few SPIR-V instructions that say what a compute shader needs of a device
 * (vk_spirv.h). One pass: SPIR-V declares types and constants before their use, and the
 * two forward references it allows here (LocalSizeId operands, the WorkgroupSize
 * decoration) are resolved at the end. */
#include "vk_spirv.h"

#include <stdio.h>
#include <stdlib.h>

enum {
    OP_EXECUTION_MODE = 16,
    OP_TYPE_BOOL = 20,
    OP_TYPE_INT = 21,
    OP_TYPE_FLOAT = 22,
    OP_TYPE_VECTOR = 23,
    OP_TYPE_MATRIX = 24,
    OP_TYPE_ARRAY = 28,
    OP_TYPE_STRUCT = 30,
    OP_TYPE_POINTER = 32,
    OP_CONSTANT_TRUE = 41,
    OP_CONSTANT_FALSE = 42,
    OP_CONSTANT = 43,
    OP_CONSTANT_COMPOSITE = 44,
    OP_SPEC_CONSTANT_TRUE = 48,
    OP_SPEC_CONSTANT_FALSE = 49,
    OP_SPEC_CONSTANT = 50,
    OP_SPEC_CONSTANT_COMPOSITE = 51,
    OP_SPEC_CONSTANT_OP = 52,
    OP_VARIABLE = 59,
    OP_DECORATE = 71,
    OP_EXECUTION_MODE_ID = 331,
};
enum { MODE_LOCAL_SIZE = 17, MODE_LOCAL_SIZE_ID = 38 };
enum { STORAGE_WORKGROUP = 4, DECORATION_BUILTIN = 11, BUILTIN_WORKGROUP_SIZE = 25 };
enum { MAX_BOUND = 1u << 22 };         /* ids; far above any real shader's */
#define HUGE_BYTES ((uint64_t)1 << 40) /* sizes saturate here: no device has that much */

static uint64_t sat_mul(uint64_t a, uint64_t b) {
    return b && a > HUGE_BYTES / b ? HUGE_BYTES : a * b;
}
static uint64_t sat_add(uint64_t a, uint64_t b) {
    return a + b > HUGE_BYTES ? HUGE_BYTES : a + b;
}

typedef struct id_info {
    uint64_t size;             /* a type's bytes (0: not a sized type) */
    uint64_t value;            /* a scalar constant's value (spec constants: their default) */
    uint32_t align;            /* a type's alignment */
    uint32_t pointee, storage; /* a pointer type's */
    uint32_t comp[3];          /* a composite constant's first three constituents */
    uint8_t has_value, is_pointer, unsized;
} id_info;

/* The value of OpSpecConstantOp's operation on known operands; 0 where it is not one this
 * reader evaluates (the module is still valid: its size is then only a floor). Sizes are
 * not negative, so the signed forms read as the unsigned ones. */
static int spec_op(uint32_t op, const uint64_t *a, int n, uint64_t *out) {
    int unary = op == 113 || op == 114; /* UConvert, SConvert */
    if (op == 169) {                    /* Select */
        if (n != 3) return 0;
        *out = a[0] ? a[1] : a[2];
        return 1;
    }
    if (n != (unary ? 1 : 2)) return 0;
    uint64_t x = a[0], y = unary ? 0 : a[1];
    if ((op == 134 || op == 135 || op == 137) && !y) return 0; /* a division by zero */
    switch (op) {
    case 113: /* UConvert */
    case 114: /* SConvert */
        *out = x;
        return 1;
    case 128: /* IAdd */
        *out = x + y;
        return 1;
    case 130: /* ISub */
        *out = x - y;
        return 1;
    case 132: /* IMul */
        *out = x * y;
        return 1;
    case 134: /* UDiv */
    case 135: /* SDiv */
        *out = x / y;
        return 1;
    case 137: /* UMod */
        *out = x % y;
        return 1;
    case 194: /* ShiftRightLogical */
        *out = y < 64 ? x >> y : 0;
        return 1;
    case 196: /* ShiftLeftLogical */
        *out = y < 64 ? x << y : 0;
        return 1;
    case 197: /* BitwiseOr */
        *out = x | y;
        return 1;
    case 199: /* BitwiseAnd */
        *out = x & y;
        return 1;
    case 170: /* IEqual */
        *out = x == y;
        return 1;
    case 172: /* UGreaterThan */
        *out = x > y;
        return 1;
    case 176: /* ULessThan */
        *out = x < y;
        return 1;
    default:
        return 0;
    }
}

int vk_spirv_read(const uint32_t *code, size_t bytes, vk_spirv_needs *out, char *err,
                  size_t err_len) {
    *out = (vk_spirv_needs){.shared_known = 1};
    if (!code || bytes < 20 || bytes % 4) {
        snprintf(err, err_len, "not SPIR-V: %zu bytes", bytes);
        return -1;
    }
    size_t nw = bytes / 4;
    if (code[0] != 0x07230203u) {
        snprintf(err, err_len, "not SPIR-V in host byte order: magic 0x%08x", code[0]);
        return -1;
    }
    uint32_t bound = code[3];
    if (!bound || bound > MAX_BOUND) {
        snprintf(err, err_len, "SPIR-V id bound %u out of range", bound);
        return -1;
    }
    id_info *id = calloc(bound, sizeof *id);
    if (!id) {
        snprintf(err, err_len, "out of memory reading SPIR-V");
        return -1;
    }
    uint32_t wgs_id = 0, size_ids[3] = {0, 0, 0};
    int rc = 0;
#define ID_OK(x) ((x) < bound)
#define BAD(...)                                                                                   \
    do {                                                                                           \
        snprintf(err, err_len, __VA_ARGS__);                                                       \
        rc = -1;                                                                                   \
        goto done;                                                                                 \
    } while (0)
    for (size_t at = 5; at < nw;) {
        uint32_t n = code[at] >> 16, op = code[at] & 0xffffu;
        if (!n || n > nw - at) BAD("SPIR-V instruction at word %zu runs past the module", at);
        const uint32_t *w = code + at;
        at += n;
        /* every case below reads w[1..] only where n says they exist */
        switch (op) {
        case OP_EXECUTION_MODE:
            if (n >= 6 && w[2] == MODE_LOCAL_SIZE)
                for (int i = 0; i < 3; i++) out->local[i] = w[3 + i];
            break;
        case OP_EXECUTION_MODE_ID:
            if (n >= 6 && w[2] == MODE_LOCAL_SIZE_ID)
                for (int i = 0; i < 3; i++) size_ids[i] = w[3 + i];
            break;
        case OP_DECORATE:
            if (n >= 4 && w[2] == DECORATION_BUILTIN && w[3] == BUILTIN_WORKGROUP_SIZE)
                wgs_id = w[1];
            break;
        case OP_TYPE_BOOL:
            if (n >= 2 && ID_OK(w[1])) id[w[1]].size = id[w[1]].align = 4;
            break;
        case OP_TYPE_INT:
        case OP_TYPE_FLOAT:
            if (n < 3 || !ID_OK(w[1]) || !w[2] || w[2] % 8 || w[2] > 64)
                BAD("SPIR-V scalar type at word %zu is malformed", at - n);
            id[w[1]].size = id[w[1]].align = w[2] / 8;
            break;
        case OP_TYPE_VECTOR:
        case OP_TYPE_MATRIX:
            if (n < 4 || !ID_OK(w[1]) || !ID_OK(w[2]) || !w[3])
                BAD("SPIR-V vector or matrix type at word %zu is malformed", at - n);
            id[w[1]].size = sat_mul(id[w[2]].size, w[3]);
            id[w[1]].align = id[w[2]].align;
            id[w[1]].unsized = id[w[2]].unsized;
            break;
        case OP_TYPE_ARRAY: {
            if (n < 4 || !ID_OK(w[1]) || !ID_OK(w[2]) || !ID_OK(w[3]))
                BAD("SPIR-V array type at word %zu is malformed", at - n);
            id_info *t = &id[w[1]], *e = &id[w[2]], *len = &id[w[3]];
            uint64_t stride = e->align ? (e->size + e->align - 1) / e->align * e->align : e->size;
            t->align = e->align;
            t->unsized = e->unsized || !len->has_value;
            t->size = len->has_value ? sat_mul(stride, len->value) : 0;
            break;
        }
        case OP_TYPE_STRUCT: {
            if (n < 2 || !ID_OK(w[1])) BAD("SPIR-V struct type at word %zu is malformed", at - n);
            id_info *t = &id[w[1]];
            uint64_t off = 0;
            uint32_t al = 1;
            for (uint32_t i = 2; i < n; i++) {
                if (!ID_OK(w[i])) BAD("SPIR-V struct type at word %zu is malformed", at - n);
                const id_info *m = &id[w[i]];
                uint32_t ma = m->align ? m->align : 1;
                off = sat_add((off + ma - 1) / ma * ma, m->size);
                if (ma > al) al = ma;
                t->unsized |= m->unsized;
            }
            t->size = (off + al - 1) / al * al;
            t->align = al;
            break;
        }
        case OP_TYPE_POINTER:
            if (n < 4 || !ID_OK(w[1]) || !ID_OK(w[3]))
                BAD("SPIR-V pointer type at word %zu is malformed", at - n);
            id[w[1]].is_pointer = 1;
            id[w[1]].storage = w[2];
            id[w[1]].pointee = w[3];
            break;
        case OP_CONSTANT_TRUE:
        case OP_CONSTANT_FALSE:
        case OP_SPEC_CONSTANT_TRUE:
        case OP_SPEC_CONSTANT_FALSE:
            if (n >= 3 && ID_OK(w[2])) {
                id[w[2]].has_value = 1;
                id[w[2]].value = op == OP_CONSTANT_TRUE || op == OP_SPEC_CONSTANT_TRUE;
            }
            break;
        case OP_CONSTANT:
        case OP_SPEC_CONSTANT:
            if (n < 4 || !ID_OK(w[2])) BAD("SPIR-V constant at word %zu is malformed", at - n);
            id[w[2]].has_value = 1;
            id[w[2]].value = w[3] | (n >= 5 ? (uint64_t)w[4] << 32 : 0);
            break;
        case OP_CONSTANT_COMPOSITE:
        case OP_SPEC_CONSTANT_COMPOSITE:
            if (n >= 3 && ID_OK(w[2]))
                for (uint32_t i = 0; i < 3 && 3 + i < n; i++) id[w[2]].comp[i] = w[3 + i];
            break;
        case OP_SPEC_CONSTANT_OP: {
            if (n < 4 || !ID_OK(w[2])) BAD("SPIR-V constant at word %zu is malformed", at - n);
            uint64_t a[3];
            int k = 0, known = n - 4 <= 3;
            for (uint32_t i = 4; i < n && known; i++) {
                known = ID_OK(w[i]) && id[w[i]].has_value;
                if (known) a[k++] = id[w[i]].value;
            }
            uint64_t v;
            if (known && spec_op(w[3], a, k, &v)) {
                id[w[2]].has_value = 1;
                id[w[2]].value = v;
            }
            break;
        }
        case OP_VARIABLE:
            if (n < 4 || !ID_OK(w[1])) BAD("SPIR-V variable at word %zu is malformed", at - n);
            if (w[3] == STORAGE_WORKGROUP) {
                const id_info *p = &id[w[1]];
                if (!p->is_pointer || !ID_OK(p->pointee))
                    BAD("SPIR-V variable at word %zu has no pointer type", at - n);
                const id_info *t = &id[p->pointee];
                out->shared_bytes = sat_add(out->shared_bytes, t->size);
                if (t->unsized) out->shared_known = 0;
            }
            break;
        default:
            break;
        }
    }
    /* the WorkgroupSize built-in takes precedence over the execution modes */
    const uint32_t *ids = wgs_id && ID_OK(wgs_id) ? id[wgs_id].comp : size_ids[0] ? size_ids : NULL;
    if (ids)
        for (int i = 0; i < 3; i++) {
            if (!ID_OK(ids[i]) || !id[ids[i]].has_value || id[ids[i]].value > 0xffffffffu)
                BAD("SPIR-V workgroup size is not a constant");
            out->local[i] = (uint32_t)id[ids[i]].value;
        }
done:
    free(id);
    return rc;
#undef BAD
#undef ID_OK
}
