/* Paged decode attention for CPUs: one new query per sequence.
 *
 * Keys and values are read straight from their pages through the block table, one token at a
 * time, the way the Triton kernel (triton_decode.py) and vLLM's paged_attention_v1 read them.
 * The torch backend instead gathers every sequence's keys and values into a dense copy first
 * and then runs a batched matmul: at decode sizes that copy, and the per-matrix overhead of
 * batched matmuls of a [group, head_dim] x [head_dim, len] shape, cost far more than the
 * arithmetic. Here nothing is copied and nothing outside a sequence is read, so a NaN left in
 * an unused slot can never reach the output.
 *
 * cpu_decode.py compiles this file twice, with SCALAR=float (EXP=exp_float) and SCALAR=double
 * (EXP=exp), for the machine it runs on (-march=native), and calls `paged_decode` through
 * ctypes. One call runs on one thread; cpu_decode.py splits large calls into runs of whole
 * sequences, one per thread.
 *
 * Layouts: q [S, H, D] with strides (q_seq_stride, q_head_stride, 1), so a strided view into a
 * fused qkv projection works as is; k_cache, v_cache [num_pages, page_size, KVH, D] and
 * out [S, H, D], contiguous; block_tables int32 [S, table_width]; seq_lens int32 [S] (tokens
 * cached, the new one included); scores and slots: scratch for H * max(seq_lens) values and
 * max(seq_lens) slot numbers.
 * Query head h reads KV head h / group, group = H / KVH (grouped-query attention).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef SCALAR
#define SCALAR float
#define EXP exp_float
#endif

/* e^x in float that the compiler can vectorise (libm's expf is a call per element): x = n ln2 + r
 * with |r| <= ln2 / 2, e^x = 2^n e^r, e^r by Cephes' degree-6 polynomial (within 1e-7 relative,
 * about one rounding), 2^n written straight into the exponent bits. Inputs are clamped to the
 * range where the result is a normal float: softmax and SiLU never need more. */
static inline float exp_float(float x)
{
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.0f ? 88.0f : x;
    /* round to nearest by adding and removing 1.5 * 2^23: arithmetic, no call */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f; /* ln 2 in two parts: exact n * ln2 */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float two_to_n;
    memcpy(&two_to_n, &bits, sizeof two_to_n);
    return p * two_to_n;
}

/* How many tokens ahead to ask for key rows: pages are scattered, so the hardware prefetcher
 * cannot guess where the next page starts, but the block table can. */
#define PREFETCH_AHEAD 4


/* Ask for every cache line of a row: the loads come later, from cache, not from memory. */
static inline void prefetch_row(const SCALAR *row, int64_t count)
{
    for (int64_t i = 0; i < count; i += 64 / sizeof(SCALAR))
        __builtin_prefetch(row + i);
}

void paged_decode(const SCALAR *q, int64_t q_seq_stride, int64_t q_head_stride,
                  const SCALAR *k_cache, const SCALAR *v_cache,
                  const int32_t *block_tables, int64_t table_width, const int32_t *seq_lens,
                  SCALAR *out, SCALAR *scores, int64_t *slots,
                  int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  int64_t page_size, SCALAR scale)
{
    const int64_t group = num_heads / num_kv_heads, D = head_dim;
    const int64_t slot_size = num_kv_heads * D; /* one cache slot holds every KV head of a token */

    for (int64_t s = 0; s < num_seqs; s++) {
        const int64_t n = seq_lens[s];
        const int32_t *table = block_tables + s * table_width;
        const SCALAR *q_seq = q + s * q_seq_stride;
        SCALAR *out_seq = out + s * num_heads * D;

        /* The slot of every token, page by page (no division per token: it would cost more than
         * the arithmetic of a small head). */
        for (int64_t t = 0, page = 0, row = 0; t < n; t++) {
            slots[t] = (int64_t)table[page] * page_size + row;
            if (++row == page_size) {
                row = 0;
                page++;
            }
        }

        /* scores[i * n + t] = scale * (query head i) . (key of token t, KV head i / group).
         * Token-major: each slot row (all KV heads of a token) is read once, front to back. */
        for (int64_t t = 0; t < n; t++) {
            if (t + PREFETCH_AHEAD < n)
                prefetch_row(k_cache + slots[t + PREFETCH_AHEAD] * slot_size, slot_size);
            const int64_t slot = slots[t];
            const SCALAR *k_row = k_cache + slot * slot_size;
            prefetch_row(v_cache + slot * slot_size, slot_size); /* for the second pass below */
            for (int64_t i = 0; i < num_heads; i++) {
                const SCALAR *qi = q_seq + i * q_head_stride, *k = k_row + (i / group) * D;
                SCALAR dot = 0;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < D; d++)
                    dot += qi[d] * k[d];
                scores[i * n + t] = dot * scale;
            }
        }
        /* softmax over the n tokens of each query head, in place; subtracting the max keeps exp
         * from overflowing */
        for (int64_t i = 0; i < num_heads; i++) {
            SCALAR *row = scores + i * n;
            SCALAR max = row[0];
            for (int64_t t = 1; t < n; t++)
                max = row[t] > max ? row[t] : max;
            SCALAR sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t t = 0; t < n; t++) {
                row[t] = EXP(row[t] - max);
                sum += row[t];
            }
            const SCALAR inv = 1 / sum;
            for (int64_t t = 0; t < n; t++)
                row[t] *= inv;
        }
        /* out_i = sum over t of p_it * (value of token t, KV head i / group) */
        for (int64_t d = 0; d < num_heads * D; d++)
            out_seq[d] = 0;
        for (int64_t t = 0; t < n; t++) {
            const SCALAR *v_row = v_cache + slots[t] * slot_size;
            for (int64_t i = 0; i < num_heads; i++) {
                const SCALAR *v = v_row + (i / group) * D;
                const SCALAR p = scores[i * n + t];
                SCALAR *o = out_seq + i * D;
#pragma omp simd
                for (int64_t d = 0; d < D; d++)
                    o[d] += p * v[d];
            }
        }
    }
}
