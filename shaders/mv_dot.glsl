// The dot products of decode's mat-vec, shared by its entry shaders (mul_mv.comp: token columns;
// mul_mv_id.comp: experts; mul_mv_route.comp: the MoE router; mul_mv_id_sum.comp: the summed
// expert down projection): acc[r * NC + j] = W[row r] . x[column j] over a lane's share of K.
// A workgroup of WG invocations is GROUPS = WG / TPR row groups of TPR lanes; a group takes NR
// consecutive rows (with GATE_UP 2 NR: W's, then W2's, laid out alike in the same binding and
// dotted with the same x). A row is cut into units (quant/types.glsl: pieces of a block that lie
// together) and lane l walks units l, l + TPR, ...: the lanes of a group read neighbouring bytes
// of a row at once, and every x chunk a lane loads serves its NR rows. TPR is the kernel's choice
// for K (fewer lanes a row when a row has few units, so short rows still keep every lane busy).
// The including entry declares NC and its push block p, whose first fields are K, M, w_off,
// w_row, x_off, x_col, y_off, y_col (elements a row, rows, byte offset of row 0 and bytes between
// rows of W, float offsets and strides between token columns of x and y), and, where x is not
// binding 1 (NORM_IN: the normed x in shared memory), XLOAD4(i) and XLOAD1(i).
#ifndef VKRT_MV_DOT_GLSL
#define VKRT_MV_DOT_GLSL

layout(binding = 0) readonly buffer W { uint w_data[]; };
#ifdef QWIDE
layout(binding = 0) readonly buffer W16 { uvec4 w16_data[]; };   // the same words, 16 bytes at a time
#endif
#ifdef XVEC4
layout(binding = 1) readonly buffer X { vec4 x4_data[]; };
#define XG4(i) x4_data[(i) >> 2]
#define XG1(i) x4_data[(i) >> 2][(i) & 3u]
#else
layout(binding = 1) readonly buffer X { float x_data[]; };
#define XG4(i) vec4(x_data[i], x_data[(i) + 1u], x_data[(i) + 2u], x_data[(i) + 3u])
#define XG1(i) x_data[i]
#endif
#ifndef XLOAD4
#define XLOAD4(i) XG4(i)
#define XLOAD1(i) XG1(i)
#endif

#define QBUF w_data
#include "quant/types.glsl"
#if defined(QWIDE) && !defined(QWIDE_OK)
#error "QWIDE: this weight type has no wide loads"
#endif

#define GROUPS (WG / TPR)
#ifdef GATE_UP
#define NW (2 * NR)   // weight rows a group dots: NR of W, then the same NR of W2
#else
#define NW NR
#endif
#define NV (NR * NC)   // a group's results
#define NA (NW * NC)   // a lane's sums
#ifndef MV_UNROLL
#define MV_UNROLL 1
#endif
uint rowb[NW];            // the byte offsets of the rows a group dots

// acc + w . x as four fused multiply-adds in element order: one operation a product, where
// acc + dot(w, x) adds the dot product's sum apart (a fifth for every four weights and column)
float fma4(vec4 w, vec4 x, float acc) {
    precise float s = fma(w.w, x.w, fma(w.z, x.z, fma(w.y, x.y, fma(w.x, x.x, acc))));
    return s;
}

// rows row0 .. row0 + NR - 1 of the W whose row 0 lies at byte wbase (and W2's at wbase2) as
// the rows the group dots; rows past M read row M - 1, unused
void mv_rows(uint wbase, uint wbase2, uint row0) {
    [[unroll]] for (uint r = 0u; r < NR; r++) {
        const uint roff = min(row0 + r, p.M - 1u) * p.w_row;
        rowb[r] = wbase + roff;
#ifdef GATE_UP
        rowb[NR + r] = wbase2 + roff;
#endif
    }
}

// unit uu's bytes of the row whose block is at byte b in 16-byte loads (QWIDE: the type's QWide;
// else unused), and the raw values of the unit's chunk c (< QU_C) of a run s of it
#ifdef QWIDE
#define MV_WQ_T QWide
#define MV_WQ(b, uu) qwide16(b, uu)
#define MV_RAW(s, wq, uu, c) qraw16(s, wq, c)
#else
#define MV_WQ_T uint
#define MV_WQ(b, uu) 0u
#define MV_RAW(s, wq, uu, c) qraw(s, qu_ch(uu, c))
#endif
// run `run` of the block at byte b, its header read in one 16-byte load where the type has one
// (QHDR16, with the wide loads: NVIDIA issued Q4_K's four header words as four loads)
#if defined(QWIDE) && defined(QHDR16)
#define MV_RUN(b, run) qrun_hdr(w16_data[(b) >> 4], b, run)
#else
#define MV_RUN(b, run) qrun(b, run)
#endif

// unit u of every row the group dots: acc[r * NC + j] += W[r] (unit u) . x[j] (unit u)
void mv_unit(uint u, uint xbase, inout precise float acc[NA]) {
    const uint blk = u / QU, uu = u % QU, boff = blk * QTS;
    [[unroll]] for (uint i = 0u; i < QU_R; i++) {
        const uint run = qu_run(uu, i);
        const uint k0 = xbase + blk * QK + run * QR;
#if NC == 1
        // one column: the run's x chunks, then each row's dot product with them:
        // sum(raw * x) and sum(x), as value = a * raw + b
        vec4 xv[QU_C * NC];
        float sum_[NC];
        [[unroll]] for (uint j = 0u; j < NC; j++) {
            sum_[j] = 0.0;
            [[unroll]] for (uint c = 0u; c < QU_C; c++) {
                xv[c * NC + j] = XLOAD4(k0 + j * p.x_col + 4u * qu_ch(uu, c));
                sum_[j] += dot(xv[c * NC + j], vec4(1.0));
            }
        }
        [[unroll]] for (uint r = 0u; r < NW; r++) {
            const QRun s = MV_RUN(rowb[r] + boff, run);
            const MV_WQ_T wq = MV_WQ(rowb[r] + boff, uu);
            precise float dot_[NC];
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                dot_[j] = 0.0;
            }
            [[unroll]] for (uint c = 0u; c < QU_C; c++) {
                const vec4 raw = MV_RAW(s, wq, uu, c);
                [[unroll]] for (uint j = 0u; j < NC; j++) {
                    dot_[j] = fma4(raw, xv[c * NC + j], dot_[j]);
                }
            }
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                acc[r * NC + j] += s.a * dot_[j] + s.b * sum_[j];
            }
        }
#else
        // several columns: chunk by chunk, x for every column, then each row's dot products
        // with it (a lane holds one chunk of x a column: a unit's 8 chunks x 4 columns would be
        // 128 registers). The sums add their terms in the same order as above
        QRun s[NW];
        MV_WQ_T wq[NW];
        float sum_[NC];
        precise float dot_[NA];
        [[unroll]] for (uint r = 0u; r < NW; r++) {
            s[r] = MV_RUN(rowb[r] + boff, run);
            wq[r] = MV_WQ(rowb[r] + boff, uu);
        }
        [[unroll]] for (uint v = 0u; v < NA; v++) {
            dot_[v] = 0.0;
        }
        [[unroll]] for (uint j = 0u; j < NC; j++) {
            sum_[j] = 0.0;
        }
        [[unroll]] for (uint c = 0u; c < QU_C; c++) {
            vec4 xv[NC];
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                xv[j] = XLOAD4(k0 + j * p.x_col + 4u * qu_ch(uu, c));
                sum_[j] += dot(xv[j], vec4(1.0));
            }
            [[unroll]] for (uint r = 0u; r < NW; r++) {
                const vec4 raw = MV_RAW(s[r], wq[r], uu, c);
                [[unroll]] for (uint j = 0u; j < NC; j++) {
                    dot_[r * NC + j] = fma4(raw, xv[j], dot_[r * NC + j]);
                }
            }
        }
        [[unroll]] for (uint r = 0u; r < NW; r++) {
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                acc[r * NC + j] += s[r].a * dot_[r * NC + j] + s[r].b * sum_[j];
            }
        }
#endif
    }
}

// acc = lane `lane`'s partial dot products of the group's rows (mv_rows) with the NC columns of x
// from float xbase: its units lane, lane + TPR, ... (plain types: then its elements past the
// last whole unit)
void mv_dots(uint lane, uint xbase, inout precise float acc[NA]) {
    [[unroll]] for (uint v = 0u; v < NA; v++) {
        acc[v] = 0.0;
    }
    const uint units = (p.K / QK) * QU;
    // MV_UNROLL units a lane at a time: their loads are issued together (latency, not bandwidth,
    // bounds a short mat-vec on a wide GPU); the order of the sums is the rolled loop's
    uint u = lane;
    for (; u + (MV_UNROLL - 1u) * TPR < units; u += MV_UNROLL * TPR) {
        [[unroll]] for (uint q = 0u; q < MV_UNROLL; q++) {
            mv_unit(u + q * TPR, xbase, acc);
        }
    }
    for (; u < units; u += TPR) {
        mv_unit(u, xbase, acc);
    }
#ifdef QPLAIN
    for (uint k = units * QK + lane; k < p.K; k += TPR) {   // plain types: K need not be a multiple of 4
        [[unroll]] for (uint r = 0u; r < NW; r++) {
            const float wk = qelem(rowb[r], k);
            [[unroll]] for (uint j = 0u; j < NC; j++) {
                acc[r * NC + j] += wk * XLOAD1(xbase + j * p.x_col + k);
            }
        }
    }
#endif
}

#endif
