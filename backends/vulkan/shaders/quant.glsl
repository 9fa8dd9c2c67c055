// MLX affine-quantized weights (abi.h, LMH_Q2..LMH_Q8), shared by the q*.comp shaders, and
// microscaled ones (LMH_MXFP4, see DT_E8M0 below).
//
// Every row of the logical [rows, in] matrix is an LSB-first stream of BITS-bit codes in
// little-endian 32-bit words (wpr words a row); each GROUP consecutive values of a row
// share a scale s and a bias b, and w = s * q + b. GROUP * BITS is always a multiple of 32,
// so groups start on a word, and so does every run of 32 values: a "chunk" of exactly BITS
// words, the unit the kernels decode at once (a 3-, 5- or 6-bit code may straddle two
// words of its chunk, never two chunks).
//
// The tensor is one allocation: codes, then scales, then biases (rows x gpr values each,
// dtype SDT); the push constants give the word offsets of the two tables from the start.
// Needs BITS, GROUP and SDT as specialization constants: with the decode loops unrolled,
// every word index and shift below folds to a constant once the pipeline is specialized.

#define QMASK ((1u << BITS) - 1u)

// Code c (< 2^23) as a float without an int-to-float conversion: c in the mantissa of 2^23,
// then 2^23 taken away, both exact. NVIDIA GPUs convert at a quarter of the rate they add
// (16 a clock per SM against 64 or 128), which bounded the 4-bit matrix-vector products
// well below the memory's rate; the value is the same as float(c), so are the results.
#define QFLOAT(c) (uintBitsToFloat((c) | 0x4B000000u) - 8388608.0)

// Code k (0..31) of a chunk whose words are w[0..BITS-1] (w has room for one more, which a
// straddling test may name but never uses).
#define QCODE(w, k)                                                                         \
    ((((w)[((k)*BITS) >> 5] >> (((k)*BITS) & 31u)) |                                       \
      ((((k)*BITS) & 31u) + BITS > 32u ? (w)[(((k)*BITS) >> 5) + 1u]                        \
                                             << ((32u - (((k)*BITS) & 31u)) & 31u)          \
                                       : 0u)) &                                             \
     QMASK)

// Microscaled 4-bit weights (abi.h LMH_MXFP4) run through the same shaders as SDT DT_E8M0
// with BITS 4 and GROUP 32: a block's 16 bytes are an LSB-first stream of 4-bit codes (the
// even value in the low nibble), each code an e2m1 float, the scales one e8m0 byte a block
// (2^(s - 127)) and no biases. QVAL gives twice the e2m1 value (an integer in [-12, 12],
// from a table of nibbles in one word) and QSB 2^(s - 128), so the product is the weight,
// exactly; QBI is 0.
#define DT_E8M0 3u
#define MX_MAG 0xC8643210u // 2 x |e2m1| of magnitude codes 0..7, a nibble each

// The value a code stands for before its scale (and bias).
#define QVAL(c)                                                                             \
    (SDT == DT_E8M0                                                                         \
         ? uintBitsToFloat(floatBitsToUint(QFLOAT((MX_MAG >> (((c)&7u) * 4u)) & 15u)) |     \
                           (((c)&8u) << 28))                                                \
         : QFLOAT(c))

// 2^(s - 128) for an e8m0 byte s: a normal float from s = 2 on, subnormal below.
float mx_scale(uint s) { return uintBitsToFloat(s >= 2u ? (s - 1u) << 23 : 0x00400000u >> (1u - s)); }

// Scale i (row * gpr + group) of the table at word offset `at` of buffer BUF, and bias i.
#define QSB(BUF, at, i)                                                                     \
    (SDT == DT_E8M0 ? mx_scale((BUF[(at) + ((i) >> 2)] >> (((i)&3u) * 8u)) & 255u)         \
                    : LOADF(BUF, SDT, (SDT == DT_F32 ? (at) : (at)*2u) + (i)))
#define QBI(BUF, at, i) (SDT == DT_E8M0 ? 0.0 : QSB(BUF, at, i))

// The code at value position v (any, not only within a chunk) of the row starting at word
// `row` of buffer BUF: one or two 32-bit loads.
#define QCODE_AT(BUF, row, v)                                                               \
    (((BUF[(row) + (((v)*BITS) >> 5)] >> (((v)*BITS) & 31u)) |                              \
      ((((v)*BITS) & 31u) + BITS > 32u                                                      \
           ? BUF[(row) + (((v)*BITS) >> 5) + 1u] << ((32u - (((v)*BITS) & 31u)) & 31u)      \
           : 0u)) &                                                                         \
     QMASK)
