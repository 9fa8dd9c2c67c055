/* The SPIR-V of every shader, compiled from the shaders/ directory at build time by
 * glslangValidator into C arrays (spv_*.h in the build directory). */
#include "vk_backend.h"

#include "spv_argmax.h"
#include "spv_cols.h"
#include "spv_conv1d.h"
#include "spv_delta.h"
#include "spv_delta_sg.h"
#include "spv_delta_prep.h"
#include "spv_delta_seq.h"
#include "spv_scan.h"
#include "spv_ssd_out.h"
#include "spv_ssd_pass.h"
#include "spv_ssd_states.h"
#include "spv_attention.h"
#include "spv_attn_decode.h"
#include "spv_attn_decode_seqs.h"
#include "spv_attn_coop.h"
#include "spv_bw_read.h"
#include "spv_coop_peak.h"
#include "spv_fma_peak.h"
#include "spv_copy.h"
#include "spv_copy_seqs.h"
#include "spv_eltwise.h"
#include "spv_get_rows.h"
#include "spv_matmul.h"
#include "spv_matmul_big.h"
#include "spv_matmul_coop.h"
#include "spv_qmatmul_coop.h"
#include "spv_matmul_moe.h"
#include "spv_matvec.h"
#include "spv_matvec_moe.h"
#include "spv_matvec_moe_sg.h"
#include "spv_matvec_sg.h"
#include "spv_matvec8.h"
#include "spv_matvec8_sg.h"
#include "spv_matvec1.h"
#include "spv_matvec1_sg.h"
#include "spv_matvec1_fx.h"
#include "spv_matvec1_fx_sg.h"
#include "spv_qmatvec8.h"
#include "spv_qmatvec8_sg.h"
#include "spv_qmatvec1.h"
#include "spv_qmatvec1_sg.h"
#include "spv_qmatvec1_fx.h"
#include "spv_qmatvec1_fx_sg.h"
#include "spv_moe_combine.h"
#include "spv_moe_route.h"
#include "spv_moe_sort.h"
#include "spv_split_sum.h"
#include "spv_qget_rows.h"
#include "spv_qmatmul.h"
#include "spv_qmatmul_big.h"
#include "spv_qmatmul_moe.h"
#include "spv_qmatvec.h"
#include "spv_qmatvec_moe.h"
#include "spv_qmatvec_moe_sg.h"
#include "spv_qmatvec_sg.h"
#include "spv_rms_norm.h"
#include "spv_rms_norm_sg.h"
#include "spv_rms_norm_add.h"
#include "spv_rms_norm_add_sg.h"
#include "spv_rms_norm_rope.h"
#include "spv_rms_norm_rope_sg.h"
#include "spv_rope.h"
#include "spv_rope_switch.h"
#include "spv_transpose.h"

#define SH(n)                                                                                      \
    { spv_##n, NULL, sizeof spv_##n, 0, #n }
#define SH_SG(n)                                                                                   \
    { spv_##n, spv_##n##_sg, sizeof spv_##n, sizeof spv_##n##_sg, #n }

const vk_spirv vk_shaders[VK_SH_COUNT] = {
    [VK_SH_ELTWISE] = SH(eltwise),
    [VK_SH_COPY] = SH(copy),
    [VK_SH_COPY_SEQS] = SH(copy_seqs),
    [VK_SH_GET_ROWS] = SH(get_rows),
    [VK_SH_TRANSPOSE] = SH(transpose),
    [VK_SH_RMS_NORM] = SH_SG(rms_norm),
    [VK_SH_RMS_NORM_ADD] = SH_SG(rms_norm_add),
    [VK_SH_RMS_NORM_ROPE] = SH_SG(rms_norm_rope),
    [VK_SH_MATVEC1] = SH_SG(matvec1),
    [VK_SH_QMATVEC1] = SH_SG(qmatvec1),
    [VK_SH_MATVEC1_FX] = SH_SG(matvec1_fx),
    [VK_SH_QMATVEC1_FX] = SH_SG(qmatvec1_fx),
    [VK_SH_ROPE] = SH(rope),
    [VK_SH_MATVEC] = SH_SG(matvec),
    [VK_SH_MATVEC8] = SH_SG(matvec8),
    [VK_SH_MATMUL] = SH(matmul),
    [VK_SH_MATVEC_MOE] = SH_SG(matvec_moe),
    [VK_SH_MATMUL_MOE] = SH(matmul_moe),
    [VK_SH_ATTENTION] = SH(attention),
    [VK_SH_ATTN_DECODE] = SH(attn_decode),
    [VK_SH_ATTN_DECODE_SEQS] = SH(attn_decode_seqs),
    [VK_SH_MOE_ROUTE] = SH(moe_route),
    [VK_SH_MOE_SORT] = SH(moe_sort),
    [VK_SH_MOE_COMBINE] = SH(moe_combine),
    [VK_SH_SPLIT_SUM] = SH(split_sum),
    [VK_SH_QMATVEC] = SH_SG(qmatvec),
    [VK_SH_QMATVEC8] = SH_SG(qmatvec8),
    [VK_SH_QMATMUL] = SH(qmatmul),
    [VK_SH_QMATVEC_MOE] = SH_SG(qmatvec_moe),
    [VK_SH_QMATMUL_MOE] = SH(qmatmul_moe),
    [VK_SH_QGET_ROWS] = SH(qget_rows),
    [VK_SH_MATMUL_COOP] = SH(matmul_coop),
    [VK_SH_QMATMUL_COOP] = SH(qmatmul_coop),
    [VK_SH_ATTN_COOP] = SH(attn_coop),
    [VK_SH_BW_READ] = SH(bw_read),
    [VK_SH_ARGMAX] = SH(argmax),
    [VK_SH_MATMUL_BIG] = SH(matmul_big),
    [VK_SH_QMATMUL_BIG] = SH(qmatmul_big),
    [VK_SH_FMA_PEAK] = SH(fma_peak),
    [VK_SH_COOP_PEAK] = SH(coop_peak),
    [VK_SH_COLS] = SH(cols),
    [VK_SH_CONV1D] = SH(conv1d),
    [VK_SH_SCAN] = SH(scan),
    [VK_SH_SSD_STATES] = SH(ssd_states),
    [VK_SH_SSD_PASS] = SH(ssd_pass),
    [VK_SH_SSD_OUT] = SH(ssd_out),
    [VK_SH_DELTA] = SH_SG(delta),
    [VK_SH_DELTA_PREP] = SH(delta_prep),
    [VK_SH_DELTA_SEQ] = SH(delta_seq),
    [VK_SH_ROPE_SWITCH] = SH(rope_switch),
    [VK_SH_PLUGIN] = {NULL, NULL, 0, 0, "plugin_kernel"}, /* SPIR-V from another plugin */
};
