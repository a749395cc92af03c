// The weight type of a generic kernel, chosen by the define QTYPE_<NAME> (vkrt.ops.quant sets it
// from the type table). Every type include defines:
//   QK     elements per block          QTS   bytes per block
//   QR     elements per run (consecutive elements sharing one scale and min; QK % QR == 0)
//   QALIGN alignment of a block in bytes (1, 2 or 4)
//   QRun qrun(uint blk, uint r)  run r of the block at byte blk: data offsets and a, b with
//                                value ~= a * raw + b (for dot products: a * sum(raw x) + b * sum(x))
//   vec4 qraw(QRun s, uint c)    raw integer values of elements 4c .. 4c+3 of the run, as floats
//   vec4 qget(QRun s, uint c)    their exact values, in gguf.quants' order of operations
//                                (or QGET_SCALED: value = a * raw, qget defined here)
// Plain types (QPLAIN) also define qelem(row, k), element k of the row at byte `row`.
// Every kernel calls qinit() first, in uniform control flow (types may fill shared tables).
// The mat-vec kernel walks a row in units, pieces of a block that lie together in memory so that
// neighbouring lanes read neighbouring bytes. A type may define QU units a block, each QU_R runs
// of QU_C chunks: run qu_run(u, i) (i < QU_R), chunks qu_c0(u) .. + QU_C. Unset: a unit is a run.
// A type with wide loads (QWIDE_OK) defines, where the mat-vec's QWIDE is set (w16_data: the
// weights as uvec4), a struct QWide, QWide qwide16(uint blk, uint u) loading unit u's bytes in
// 16-byte loads, and vec4 qraw16(QRun s, QWide w, uint c) as qraw(s, qu_ch(u, c)). It may define
// QHDR16 and QRun qrun_hdr(uvec4 h, uint blk, uint r): qrun from the block's first 16 bytes, which
// the mat-vec then reads in one load.
#ifndef VKRT_QUANT_TYPES_GLSL
#define VKRT_QUANT_TYPES_GLSL

#if defined(QTYPE_F32)
#include "f32.glsl"
#elif defined(QTYPE_F16)
#include "f16.glsl"
#elif defined(QTYPE_BF16)
#include "bf16.glsl"
#elif defined(QTYPE_Q4_0)
#include "q4_0.glsl"
#elif defined(QTYPE_Q4_1)
#include "q4_1.glsl"
#elif defined(QTYPE_Q5_0)
#include "q5_0.glsl"
#elif defined(QTYPE_Q5_1)
#include "q5_1.glsl"
#elif defined(QTYPE_Q8_0)
#include "q8_0.glsl"
#elif defined(QTYPE_Q2_K)
#include "q2_k.glsl"
#elif defined(QTYPE_Q3_K)
#include "q3_k.glsl"
#elif defined(QTYPE_Q4_K)
#include "q4_k.glsl"
#elif defined(QTYPE_Q5_K)
#include "q5_k.glsl"
#elif defined(QTYPE_Q6_K)
#include "q6_k.glsl"
#elif defined(QTYPE_IQ4_NL)
#include "iq4_nl.glsl"
#elif defined(QTYPE_IQ4_XS)
#include "iq4_xs.glsl"
#elif defined(QTYPE_IQ3_XXS)
#include "iq3_xxs.glsl"
#elif defined(QTYPE_IQ3_S)
#include "iq3_s.glsl"
#elif defined(QTYPE_IQ2_XXS)
#include "iq2_xxs.glsl"
#elif defined(QTYPE_IQ2_XS)
#include "iq2_xs.glsl"
#elif defined(QTYPE_IQ2_S)
#include "iq2_s.glsl"
#elif defined(QTYPE_IQ1_S)
#include "iq1_s.glsl"
#elif defined(QTYPE_IQ1_M)
#include "iq1_m.glsl"
#elif defined(QTYPE_MXFP4)
#include "mxfp4.glsl"
#elif defined(QTYPE_TQ1_0)
#include "tq1_0.glsl"
#elif defined(QTYPE_TQ2_0)
#include "tq2_0.glsl"
#else
#error "no weight type: define QTYPE_<NAME>"
#endif

#ifndef QTABLES
void qinit() {}   // no tables to copy (see iq_common.glsl); kernels call it first
#endif

#ifdef QGET_SCALED   // the IQ types and MXFP4: value = a * raw
vec4 qget(QRun s, uint c) {
    precise vec4 v = s.a * qraw(s, c);
    return v;
}
#endif

#define QRUNS (QK / QR)   // runs per block
#define QCH (QR / 4)      // vec4 chunks per run

#ifndef QU
#define QU QRUNS
#define QU_R 1
#define QU_C QCH
uint qu_run(uint u, uint i) { return u; }
uint qu_ch(uint u, uint c) { return c; }
#endif

// elements 4j .. 4j+3 of the block at byte blk
vec4 dq4(uint blk, uint j) { return qget(qrun(blk, j / QCH), j % QCH); }

#ifndef QPLAIN
float qelem(uint row, uint k) { return dq4(row + (k / QK) * QTS, (k % QK) >> 2)[k & 3u]; }
#endif

#endif
