// The KV loop of flash_attn.comp, included there once (LOOP_MASKED = HAS_MASK), or with MASK_ZERO
// twice: reading the mask (LOOP_MASKED 1) and, for steps flagged mask-zero, not (0).
    [[dont_unroll]] for (uint j = split * per_split; j < j_end; ++j) {
#if LOADS_FIRST > 1
        // this tile's values from the last iteration (3: every thread's share stored once the
        // last tile's reads are done; the trip count is the workgroup's, so no thread skips these
        // barriers); the next tile's loads go out now (before anything can skip this tile)
#if LOADS_FIRST == 3
        barrier();
        STORE_KV_SHARE(ksn, vsn);
        barrier();
#if NR_PATCH
        if (j == nr_j) {   // (the workgroup's)
            const uint row = nr_col - j * BC;
            for (uint i = t; i < HSK4; i += WG) {
                k_sh[row * KSTR + i] = nk_sh[i];
            }
            for (uint i = t; i < HSV4; i += WG) {
                v_sh[row * VSTR + i] = nv_sh[i];
            }
            barrier();
        }
#endif
#else
        K_RAW kt[KR][CPT] = kn;
        V_RAW vt[CPT][VR] = vn;
#endif
#if LOOP_MASKED
        uint mt[RPT][CPT] = mn;
        LOAD_MASK(min(j + 1u, j_end - 1u), mn);
#endif
        LOAD_NEXT_KV(min(j + 1u, j_end - 1u));
#elif LOADS_FIRST
        K_RAW kt[KR][CPT];
        V_RAW vt[CPT][VR];
        LOAD_KV(j, kt, vt);
#endif
#if NR_PATCH && LOADS_FIRST < 3
        if (j == nr_j) {
            FA_UNROLL for (uint c = 0; c < CPT; ++c) {
                if (j * BC + c * COLS + col_tid == nr_col) {
#if K_SEG
                    const uint ke = k_base + nr_col * p.k_nb1;
                    FA_UNROLL for (uint k = 0; k < KR; ++k) {
                        KVQ_SEG_LOAD_AT(nkw_sh, kvq_block(K_Q, ke) >> 2, K_Q, KG, ke + 4u * KCH(k), kt[k][c].w, KSW)
                    }
#else
                    FA_UNROLL for (uint k = 0; k < KR; ++k) {
                        kt[k][c] = nr_raw_k(nk_sh[KD4(k)]);
                    }
#endif
#if V_SEG
                    const uint ve = v_base + nr_col * p.v_nb1;
                    FA_UNROLL for (uint v = 0; v < VR; ++v) {
                        KVQ_SEG_LOAD_AT(nvw_sh, kvq_block(V_Q, ve) >> 2, V_Q, VG, ve + 4u * VCH(v), vt[c][v].w, VSW)
                    }
#else
                    FA_UNROLL for (uint v = 0; v < VR; ++v) {
                        vt[c][v] = nr_raw_v(nv_sh[VD4(v)]);
                    }
#endif
                }
            }
        }
#endif
        uint code = FA_MIXED;
#if LOOP_MASKED
        if (use_mask_opt) {
            code = (mo[mo_base + j / 16u] >> (2u * (j % 16u))) & 3u;
            if (code == FA_ALL_NEG_INF) {
                continue;
            }
        }
#endif
#if LOOP_MASKED
        // this thread's mask values: a thread whose part of the block is all -inf skips it
        // (with mask_opt or without: the same work either way, so the results match bit for bit)
        float mval[RPT][CPT];
        if (code == FA_MIXED) {
            bool live = false;
            FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                FA_UNROLL for (uint c = 0; c < CPT; ++c) {
#if LOADS_FIRST > 1
                    const float m = MASK_OF(mt[r][c], j, r, c);
#else
                    const float m = MASK_AT(j, r, c);
#endif
                    live = live || m != ATTN_NEG_INF;
                    mval[r][c] = m;
                }
            }
            if (!live) {
                continue;
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
                const vec4 kv = TILE_K(k, c, min(j * BC + c * COLS + col_tid, p.KV - 1u));
                FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                    s[r][c] = fma(qc[r].w, kv.w, fma(qc[r].z, kv.z, fma(qc[r].y, kv.y, fma(qc[r].x, kv.x, s[r][c]))));
                }
            }
        }
#if DOT_SUMS_AT_ONCE
        dot_sums(s, d_tid);
#elif DS > 1
        // the butterfly a level at a time over all the tile's scores (XOR_SUM's adds in its
        // order): a level's shuffles go out together, where one score's three waited in turn
        // (on GCN the offset-4 swizzle is an LDS round trip). With LOADS_FIRST 3 this replaced a
        // rolled loop a score (unrolled, ACO read the shared tile's V ahead: 140 VGPRs at head
        // 256), whose run-time offsets were ds_bpermute round trips and the score picked by
        // selects: the same VGPRs or fewer (gcn_shader_stats.py --kv all)
#define XOR_STEP_ALL_(o)                                                                \
        if (DS > (o)) {                                                                 \
            FA_UNROLL for (uint r = 0; r < RPT; ++r) {                                  \
                FA_UNROLL for (uint c = 0; c < CPT; ++c) {                              \
                    s[r][c] += subgroupShuffleXor(s[r][c], o);                          \
                }                                                                       \
            }                                                                           \
        }
        XOR_STEP_ALL_(64u) XOR_STEP_ALL_(32u) XOR_STEP_ALL_(16u) XOR_STEP_ALL_(8u) XOR_STEP_ALL_(4u)
        XOR_STEP_ALL_(2u) XOR_STEP_ALL_(1u)
#undef XOR_STEP_ALL_
#endif
        FA_UNROLL for (uint r = 0; r < RPT; ++r) {
            FA_UNROLL for (uint c = 0; c < CPT; ++c) {
                float x = s[r][c] * p.scale;
                if (p.softcap != 0.0) {
                    x = p.softcap * tanh(clamp(x, -15.0, 15.0));
                }
                s[r][c] = x;
            }
        }
#if LOOP_MASKED
        if (code == FA_MIXED) {   // (the workgroup's)
            FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                FA_UNROLL for (uint c = 0; c < CPT; ++c) {
                    s[r][c] = fma(slope, mval[r][c], s[r][c]);
                }
            }
        }
#endif
        if ((j + 1u) * BC > kv) {   // (the workgroup's) the tile of the last live cell: those past it out
            FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                FA_UNROLL for (uint c = 0; c < CPT; ++c) {
                    s[r][c] = j * BC + c * COLS + col_tid < kv ? s[r][c] : ATTN_NEG_INF;
                }
            }
        }
        FA_UNROLL for (uint r = 0; r < RPT; ++r) {
            float mx = M[r];
            FA_UNROLL for (uint c = 0; c < CPT; ++c) {
                mx = max(mx, s[r][c]);
            }
            const float alpha = exp(M[r] - mx);
#if HSV / 4 / DS >= 4   // (VD)
            const bool rose = mx != M[r];
#endif
            M[r] = mx;
            float sum = 0.0;
            FA_UNROLL for (uint c = 0; c < CPT; ++c) {
                s[r][c] = exp(s[r][c] - mx);
                sum += s[r][c];
            }
            L[r] = L[r] * alpha + sum;
            // O's rescale only where the max rose: otherwise alpha is exactly 1.0 (the same bits),
            // and a wave whose rows' maxima all held skips it. Not below 4 vec4s a row: there the
            // RX 580's compiler selects between the two (8 selects more, nothing skipped)
#if HSV / 4 / DS >= 4   // (VD)
            if (rose)
#endif
            {
                FA_UNROLL for (uint v = 0; v < VD; ++v) {
                    acc[r][v] *= alpha;
                }
            }
        }
        FA_UNROLL for (uint c = 0; c < CPT; ++c) {
            const uint col = min(j * BC + c * COLS + col_tid, p.KV - 1u);
            FA_UNROLL for (uint v = 0; v < VD; ++v) {
                const vec4 vv = TILE_V(c, v, col);
                FA_UNROLL for (uint r = 0; r < RPT; ++r) {
                    acc[r][v] = fma(vec4(s[r][c]), vv, acc[r][v]);
                }
            }
        }
    }

