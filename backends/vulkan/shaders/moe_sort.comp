#version 450
#extension GL_GOOGLE_include_directive : require
// Groups the (row, slot) pairs of an expert matmul by expert, on the device, in one
// workgroup. Writes to binding 5:
//   [0..2]             indirect dispatch arguments (out_groups, work items, 1)
//   [list_at + i]      pair indices, grouped by expert
//   [items_at + 3 i]   work items: expert, first list index, pair count (<= item_rows)
// and the number of experts used to binding 6 (host-visible, for weight_bytes_read).
// Pairs whose id is out of range get rows of zeros in dst.
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint EMAX = 64; // >= E
layout(local_size_x_id = 0) in;
#include "common.glsl"

BUF(0, D)
RBUF(3, IDS)
BUF(5, S)
BUF(6, ST)

layout(push_constant) uniform PC {
    PC_OFFSETS
    uint pairs;
    uint E;
    uint item_rows;
    uint out_groups;
    uint list_at;
    uint items_at;
    uint stat_slot;
    uint out_;
} pc;

shared uint cnt[EMAX], start[EMAX], fill[EMAX], istart[EMAX];

void main() {
    uint l = gl_LocalInvocationID.x;
    for (uint e = l; e < pc.E; e += WG) {
        cnt[e] = 0u;
        fill[e] = 0u;
    }
    barrier();
    for (uint p = l; p < pc.pairs; p += WG) {
        int id = int(IDS[pc.oc + p]);
        if (id >= 0 && uint(id) < pc.E)
            atomicAdd(cnt[id], 1u);
        else
            for (uint o = 0; o < pc.out_; o++) D[pc.od + p * pc.out_ + o] = 0u;
    }
    barrier();
    if (l == 0u) {
        uint s = 0u, it = 0u, used = 0u;
        for (uint e = 0; e < pc.E; e++) {
            start[e] = s;
            istart[e] = it;
            s += cnt[e];
            it += (cnt[e] + pc.item_rows - 1u) / pc.item_rows;
            if (cnt[e] > 0u) used++;
        }
        S[0] = pc.out_groups;
        S[1] = it;
        S[2] = 1u;
        ST[pc.stat_slot] = used;
    }
    barrier();
    for (uint p = l; p < pc.pairs; p += WG) {
        int id = int(IDS[pc.oc + p]);
        if (id >= 0 && uint(id) < pc.E) S[pc.list_at + start[id] + atomicAdd(fill[id], 1u)] = p;
    }
    for (uint e = l; e < pc.E; e += WG) {
        uint c = cnt[e];
        for (uint j = 0; j * pc.item_rows < c; j++) {
            uint at = pc.items_at + (istart[e] + j) * 3u;
            S[at] = e;
            S[at + 1u] = start[e] + j * pc.item_rows;
            S[at + 2u] = min(pc.item_rows, c - j * pc.item_rows);
        }
    }
}
