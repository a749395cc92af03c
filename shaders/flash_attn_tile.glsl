// One KV tile of flash_attn.comp's loop (included in it; TILE_SKIP leaves the tile: `continue`, or
// `break` out of a `do { } while (false)` around it): tile TJ's scores, the online softmax and O's update, its K and V
// from TILE_K / TILE_V (with LOADS_FIRST 1 and 2 the arrays kt and vt, and the mask words mt,
// which the includer may #define to the buffer holding this tile). No include guard: the tile
// loop of LOADS_FIRST 2 includes it twice, once for each of its two buffers.
    uint code = FA_MIXED;
#if HAS_MASK
    if (use_mask_opt) {
        code = (mo[mo_base + TJ / 16u] >> (2u * (TJ % 16u))) & 3u;
        if (code == FA_ALL_NEG_INF) {
            TILE_SKIP;
        }
    }
#endif
#if HAS_MASK
    // this thread's mask values: a thread whose part of the block is all -inf skips it
    // (with mask_opt or without: the same work either way, so the results match bit for bit)
    float mval[RPT][CPT];
    if (code == FA_MIXED) {
        bool live = false;
        FA_UNROLL for (uint r = 0; r < RPT; ++r) {
            FA_UNROLL for (uint c = 0; c < CPT; ++c) {
#if LOADS_FIRST > 1
                const float m = MASK_OF(mt[r][c], TJ, r, c);
#else
                const float m = MASK_AT(TJ, r, c);
#endif
                live = live || m != ATTN_NEG_INF;
                mval[r][c] = m;
            }
        }
        if (!live) {
            TILE_SKIP;
        }
    }
#endif
    float s[RPT][CPT];
    FA_UNROLL for (uint r = 0; r < RPT; ++r) {
        FA_UNROLL for (uint c = 0; c < CPT; ++c) {
            s[r][c] = 0.0;
        }
    }
    FA_UNROLL for (uint k = 0; k < KD; ++k) {
        const uint d4 = KD4(k);
        vec4 qc[RPT];
        FA_UNROLL for (uint r = 0; r < RPT; ++r) {
            qc[r] = tile[(rg * RPT + r) * HSK4 + d4];
        }
        FA_UNROLL for (uint c = 0; c < CPT; ++c) {
            const vec4 kv = TILE_K(k, c, min(TJ * BC + c * COLS + col_tid, p.KV - 1u));
            FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                s[r][c] = fma(qc[r].w, kv.w, fma(qc[r].z, kv.z, fma(qc[r].y, kv.y, fma(qc[r].x, kv.x, s[r][c]))));
            }
        }
    }
    FA_UNROLL for (uint r = 0; r < RPT; ++r) {
        float mx = M[r];
        FA_UNROLL for (uint c = 0; c < CPT; ++c) {
#if DS > 1
#if LOADS_FIRST == 3
            // a loop ACO keeps (Mesa 22): unrolled, it reads the tile's V from shared memory
            // ahead, head 256's quantised kernel at 140 VGPRs (1 wave) against 84 (2)
            for (uint w = DS / 2u; w > 0u; w >>= 1u) {
                s[r][c] += subgroupShuffleXor(s[r][c], w);
            }
#else
            FA_UNROLL for (uint i = 0u; i < HALVINGS(DS); ++i) {
                s[r][c] += subgroupShuffleXor(s[r][c], (DS >> 1u) >> i);
            }
#endif
#endif
            const uint col = TJ * BC + c * COLS + col_tid;
            float x = s[r][c] * p.scale;
            if (p.softcap != 0.0) {
                x = p.softcap * tanh(clamp(x, -15.0, 15.0));
            }
#if HAS_MASK
            if (code == FA_MIXED) {
                x = fma(slope, mval[r][c], x);
            }
#endif
            s[r][c] = col < kv ? x : ATTN_NEG_INF;
            mx = max(mx, s[r][c]);
        }
        const float alpha = exp(M[r] - mx);
        M[r] = mx;
        float sum = 0.0;
        FA_UNROLL for (uint c = 0; c < CPT; ++c) {
            s[r][c] = exp(s[r][c] - mx);
            sum += s[r][c];
        }
        L[r] = L[r] * alpha + sum;
        FA_UNROLL for (uint v = 0; v < VD; ++v) {
            acc[r][v] *= alpha;
        }
    }
    FA_UNROLL for (uint c = 0; c < CPT; ++c) {
        const uint col = min(TJ * BC + c * COLS + col_tid, p.KV - 1u);
        FA_UNROLL for (uint v = 0; v < VD; ++v) {
            const vec4 vv = TILE_V(c, v, col);
            FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                acc[r][v] = fma(vec4(s[r][c]), vv, acc[r][v]);
            }
        }
    }
