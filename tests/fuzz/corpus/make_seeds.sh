#!/usr/bin/env bash
# Writes the safetensors seed files (tiny valid images) of corpus/safetensors/ and the
# SPIR-V seeds of corpus/spirv/ (tests/vulkan/spirv/'s shaders, by glslangValidator). The
# files are committed; rerun this only to change them. config seeds are plain JSON.
set -eu
cd "$(dirname "$0")"
mkdir -p safetensors

le64() { # n: 8 bytes little-endian
    local i
    # shellcheck disable=SC2059 # the format is the escape we build
    for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $((($1 >> (8 * i)) & 255)))"; done
}

seed() { # name header data_len
    { le64 "${#2}"; printf '%s' "$2"; head -c "$3" /dev/zero | tr '\0' '\1'; } >"safetensors/$1"
}

seed one-f32 '{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}' 16
seed padded '{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"b":{"dtype":"F16","shape":[1],"data_offsets":[6,8]}}        ' 8
seed empty '{}      ' 0
seed dtypes '{"f32":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"f16":{"dtype":"F16","shape":[1],"data_offsets":[4,6]},"bf16":{"dtype":"BF16","shape":[1],"data_offsets":[6,8]},"u32":{"dtype":"U32","shape":[],"data_offsets":[8,12]},"i32":{"dtype":"I32","shape":[1,1],"data_offsets":[12,16]},"u8":{"dtype":"U8","shape":[1,1,1],"data_offsets":[16,17]},"i8":{"dtype":"I8","shape":[1,1,1,1],"data_offsets":[17,18]},"z":{"dtype":"F32","shape":[0,3],"data_offsets":[18,18]}}' 20
seed shards '{"model.layers.0.self_attn.q_proj.weight":{"dtype":"BF16","shape":[4,2],"data_offsets":[0,16]},"model.layers.0.self_attn.q_proj.scales":{"dtype":"U32","shape":[2],"data_offsets":[16,24]},"model.norm.weight":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}}' 32

mkdir -p spirv
for c in plain spec none; do
    glslangValidator -V --target-env vulkan1.2 --quiet -o "spirv/$c.spv" "../../vulkan/spirv/$c.comp"
done
