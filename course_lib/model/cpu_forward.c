/* One engine step of a Llama-family model in one C call: the "cpu" forward.
 *
 * Why: the tiny model's layers are [128 x 384]-sized, so in a decode step every PyTorch op
 * (there are ~200 per step: norms, RoPE, K/V writes, attention, SwiGLU, residuals) costs far
 * more in dispatch than in arithmetic; with a handful of requests running, a step was ~2 ms
 * of which the arithmetic is ~0.1 ms. This file does the same computation as
 * transformer.py + runner.PagedAttend, in the same order, in one call: the matrix products go
 * to the BLAS that PyTorch itself uses (MKL's sgemm_/dgemm_, passed in as a function pointer),
 * attention is cpu_decode.c's paged_decode, everything else is a plain loop.
 *
 * cpu_forward.py compiles it per SCALAR (float, double) like cpu_decode.c and checks its
 * results against the PyTorch model (tests/test_cpu_forward.py).
 *
 * Layouts, all contiguous, T tokens in the flat batch, S sequences:
 *   ids, positions, slot_mapping: int64 [T]; block_tables int32 [S, table_width];
 *   seq_lens int32 [S] (tokens cached after this step); query_start int32 [S + 1] (sequence s
 *   owns rows query_start[s] .. query_start[s+1]-1, the last tokens of its seq_lens[s]);
 *   logit_rows int64 [R] -> logits [R, vocab];
 *   layers: int64 [num_layers, LAYER_FIELDS], the addresses of each layer's weights (PyTorch's
 *   [out, in] layout) and its K/V cache [num_pages, page_size, KV, D];
 *   cos_table, sin_table: [table_len, D] from rope.rope_cos_sin (sin with its first half negated).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_decode.c" /* paged_decode, SCALAR, EXP */

enum { INPUT_NORM, QKV, QKV_BIAS, O_PROJ, POST_NORM, GATE_UP, DOWN, K_CACHE, V_CACHE, LAYER_FIELDS };

/* What forward_step returns: 0, or which input was out of range (nothing was written). */
enum { OK = 0, NO_MEMORY, BAD_TOKEN, BAD_POSITION, BAD_SLOT, BAD_PAGE, BAD_LENGTHS, BAD_ROW };

/* Fortran BLAS: column-major, every argument by address. */
typedef void (*gemm_t)(const char *transa, const char *transb, const int *m, const int *n, const int *k,
                       const SCALAR *alpha, const SCALAR *a, const int *lda, const SCALAR *b, const int *ldb,
                       const SCALAR *beta, SCALAR *c, const int *ldc);

/* y[T, N] (+)= x[T, K] w[N, K]^T, x rows `x_stride` apart: F.linear. A row-major [T, N] matrix
 * is a column-major [N, T] one, so BLAS computes y^T = w x^T, with w "transposed" (its rows
 * are w's rows) and x as is. accumulate=1 adds to y: the residual connection for free. */
static void linear(gemm_t gemm, const SCALAR *x, int64_t x_stride, const SCALAR *w, SCALAR *y,
                   int64_t T, int64_t N, int64_t K, int accumulate)
{
    const int m = (int)N, n = (int)T, k = (int)K, ldb = (int)x_stride;
    const SCALAR one = 1, beta = accumulate ? 1 : 0;
    gemm("T", "N", &m, &n, &k, &one, w, &k, x, &ldb, &beta, y, &m);
}

/* transformer.rms_norm: normalised in float32 whatever SCALAR is, then scaled by the weight. */
static void rms_norm(const SCALAR *x, const SCALAR *weight, SCALAR *out, int64_t n, float eps)
{
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; i++)
        sum += (float)x[i] * (float)x[i];
    const float r = 1.0f / sqrtf(sum / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = weight[i] * (SCALAR)((float)x[i] * r);
}

/* rope.apply_rope on one head, in place: x * cos + roll(x, D/2) * signed_sin. */
static void rope(SCALAR *x, const SCALAR *cos, const SCALAR *sin, int64_t D)
{
    const int64_t half = D / 2;
    for (int64_t d = 0; d < half; d++) {
        const SCALAR a = x[d], b = x[d + half];
        x[d] = a * cos[d] + b * sin[d];
        x[d + half] = b * cos[d + half] + a * sin[d + half];
    }
}

/* Attention for a run of query rows [first, last). Each row attends to its sequence's tokens
 * up to and including itself: a decode row to all seq_lens[s], the rows of a prefill chunk to
 * fewer (causal). Rows are independent, so runs of them go to different threads. */
typedef struct {
    const SCALAR *qkv, *k_cache, *v_cache;
    const int32_t *block_tables, *seq_lens, *query_start, *row_seq;
    SCALAR *attn, *scores; /* scores: H * max_len per thread */
    int64_t *slots;        /* max_len per thread */
    int64_t qkv_width, table_width, H, KV, D, page_size, max_len, first, last, thread;
    SCALAR scale;
} attention_rows;

/* Row r of sequence s sees the tokens up to and including itself: the chunk's last row sees
 * all seq_lens[s], each row before it one fewer. */
static inline int32_t visible_tokens(const attention_rows *a, int64_t r)
{
    const int64_t s = a->row_seq[r];
    return a->seq_lens[s] - (int32_t)(a->query_start[s + 1] - 1 - r);
}

static void *attend_run(void *arg)
{
    const attention_rows *a = arg;
    SCALAR *scores = a->scores + a->thread * a->H * a->max_len;
    int64_t *slots = a->slots + a->thread * a->max_len;
    for (int64_t r = a->first; r < a->last; r++) {
        const int32_t visible = visible_tokens(a, r);
        paged_decode(a->qkv + r * a->qkv_width, a->qkv_width, a->D, a->k_cache, a->v_cache,
                     a->block_tables + a->row_seq[r] * a->table_width, a->table_width, &visible,
                     a->attn + r * a->H * a->D, scores, slots, 1, a->H, a->KV, a->D, a->page_size, a->scale);
    }
    return NULL;
}

/* How many threads attend, and which rows each takes (bounds[i] .. bounds[i+1]-1: contiguous
 * runs of about equal work). Fewer threads than allowed when each would get less than min_work
 * multiply-adds: starting a thread costs tens of microseconds. Decided once per step. */
static int64_t split_rows(const attention_rows *a, int64_t threads, int64_t min_work, int64_t *bounds)
{
    int64_t total = 0;
    for (int64_t r = 0; r < a->last; r++)
        total += visible_tokens(a, r);
    int64_t workers = total * a->H * a->D / (min_work < 1 ? 1 : min_work);
    workers = workers < threads ? workers : threads;
    workers = workers < a->last ? workers : a->last;
    workers = workers < 1 ? 1 : workers;
    int64_t r = 0, done = 0;
    bounds[0] = 0;
    for (int64_t i = 0; i < workers; i++) {
        const int64_t target = total * (i + 1) / workers;
        while (r < a->last && (done < target || i == workers - 1))
            done += visible_tokens(a, r++);
        bounds[i + 1] = r;
    }
    return workers;
}

/* One layer's attention for every row, on `workers` threads (this one included). */
static void attend_rows(const attention_rows *base, const SCALAR *k_cache, const SCALAR *v_cache,
                        const int64_t *bounds, int64_t workers)
{
    attention_rows jobs[workers];
    pthread_t ids[workers];
    int started[workers];
    for (int64_t i = 0; i < workers; i++) {
        jobs[i] = *base;
        jobs[i].k_cache = k_cache, jobs[i].v_cache = v_cache;
        jobs[i].thread = i, jobs[i].first = bounds[i], jobs[i].last = bounds[i + 1];
    }
    for (int64_t i = 1; i < workers; i++) /* a thread that fails to start: its rows run here below */
        started[i] = pthread_create(&ids[i], NULL, attend_run, &jobs[i]) == 0;
    attend_run(&jobs[0]);
    for (int64_t i = 1; i < workers; i++) {
        if (started[i])
            pthread_join(ids[i], NULL);
        else
            attend_run(&jobs[i]);
    }
}

/* Everything is checked before anything is written, so a bad step leaves the caches as they
 * were; C would otherwise read or write out of bounds where PyTorch raises. */
static int check_inputs(const int64_t *ids, const int64_t *positions, const int64_t *slot_mapping, int64_t T,
                        const int32_t *block_tables, int64_t table_width, const int32_t *seq_lens,
                        const int32_t *query_start, int64_t S, const int64_t *logit_rows, int64_t R,
                        int64_t vocab, int64_t table_len, int64_t num_pages, int64_t page_size)
{
    for (int64_t t = 0; t < T; t++) {
        if (ids[t] < 0 || ids[t] >= vocab)
            return BAD_TOKEN;
        if (positions[t] < 0 || positions[t] >= table_len)
            return BAD_POSITION;
        if (slot_mapping[t] < 0 || slot_mapping[t] >= num_pages * page_size)
            return BAD_SLOT;
    }
    if (query_start[0] != 0 || query_start[S] != T)
        return BAD_LENGTHS;
    for (int64_t s = 0; s < S; s++) {
        const int64_t rows = query_start[s + 1] - query_start[s], n = seq_lens[s];
        if (rows < 1 || n < rows || n > table_width * page_size)
            return BAD_LENGTHS;
        for (int64_t p = 0; p < (n + page_size - 1) / page_size; p++)
            if (block_tables[s * table_width + p] < 0 || block_tables[s * table_width + p] >= num_pages)
                return BAD_PAGE;
    }
    if (R > T) /* their final norms go to a buffer of T rows */
        return BAD_ROW;
    for (int64_t r = 0; r < R; r++)
        if (logit_rows[r] < 0 || logit_rows[r] >= T)
            return BAD_ROW;
    return OK;
}

int forward_step(const int64_t *ids, const int64_t *positions, const int64_t *slot_mapping, int64_t T,
                 const int32_t *block_tables, int64_t table_width, const int32_t *seq_lens,
                 const int32_t *query_start, int64_t S, const int64_t *logit_rows, int64_t R, SCALAR *logits,
                 const SCALAR *embed, const SCALAR *final_norm, const SCALAR *lm_head, const int64_t *layers,
                 int64_t num_layers, const SCALAR *cos_table, const SCALAR *sin_table, int64_t table_len,
                 int64_t hidden, int64_t inter, int64_t H, int64_t KV, int64_t D, int64_t vocab,
                 int64_t num_pages, int64_t page_size, float eps, SCALAR scale, gemm_t gemm,
                 int64_t threads, int64_t min_work_per_thread)
{
    int status = check_inputs(ids, positions, slot_mapping, T, block_tables, table_width, seq_lens, query_start,
                              S, logit_rows, R, vocab, table_len, num_pages, page_size);
    if (status != OK || T == 0)
        return status;
    int64_t max_len = 1;
    for (int64_t s = 0; s < S; s++)
        max_len = seq_lens[s] > max_len ? seq_lens[s] : max_len;

    const int64_t QKV_W = (H + 2 * KV) * D, slot_size = KV * D;
    /* One allocation for every activation of the step. */
    threads = threads < 1 ? 1 : threads;
    const int64_t sizes[] = {T * hidden, T * hidden, T * QKV_W, T * H * D, T * 2 * inter, threads * H * max_len};
    int64_t total = 0;
    for (int i = 0; i < 6; i++)
        total += sizes[i];
    SCALAR *work = malloc(total * sizeof(SCALAR));
    int64_t *slots = malloc(threads * max_len * sizeof(int64_t));
    int32_t *row_seq = malloc(T * sizeof(int32_t));
    int64_t *bounds = malloc((threads + 1) * sizeof(int64_t));
    if (work == NULL || slots == NULL || row_seq == NULL || bounds == NULL) {
        free(work);
        free(slots);
        free(row_seq);
        free(bounds);
        return NO_MEMORY;
    }
    SCALAR *x = work, *xn = x + sizes[0], *qkv = xn + sizes[1], *attn = qkv + sizes[2], *gate_up = attn + sizes[3];
    SCALAR *scores = gate_up + sizes[4];

    for (int64_t t = 0; t < T; t++)
        memcpy(x + t * hidden, embed + ids[t] * hidden, hidden * sizeof(SCALAR));
    for (int64_t s = 0; s < S; s++)
        for (int64_t r = query_start[s]; r < query_start[s + 1]; r++)
            row_seq[r] = (int32_t)s;
    /* what attention needs in every layer; the layer's caches are passed separately */
    const attention_rows att = {.qkv = qkv, .block_tables = block_tables, .seq_lens = seq_lens,
                                .query_start = query_start, .row_seq = row_seq, .attn = attn, .scores = scores,
                                .slots = slots, .qkv_width = QKV_W, .table_width = table_width, .H = H, .KV = KV,
                                .D = D, .page_size = page_size, .max_len = max_len, .first = 0, .last = T,
                                .scale = scale};
    const int64_t workers = split_rows(&att, threads, min_work_per_thread, bounds);

    for (int64_t l = 0; l < num_layers; l++) {
        const int64_t *w = layers + l * LAYER_FIELDS;
        const SCALAR *qkv_bias = (const SCALAR *)w[QKV_BIAS];
        SCALAR *k_cache = (SCALAR *)w[K_CACHE], *v_cache = (SCALAR *)w[V_CACHE];

        /* x += o_proj(attention(rope(qkv_proj(rms_norm(x))))) */
        for (int64_t t = 0; t < T; t++)
            rms_norm(x + t * hidden, (const SCALAR *)w[INPUT_NORM], xn + t * hidden, hidden, eps);
        linear(gemm, xn, hidden, (const SCALAR *)w[QKV], qkv, T, QKV_W, hidden, 0);
        for (int64_t t = 0; t < T; t++) {
            SCALAR *row = qkv + t * QKV_W;
            if (qkv_bias != NULL)
                for (int64_t i = 0; i < QKV_W; i++)
                    row[i] += qkv_bias[i];
            const SCALAR *cos = cos_table + positions[t] * D, *sin = sin_table + positions[t] * D;
            for (int64_t h = 0; h < H + KV; h++) /* the q heads, then the k heads */
                rope(row + h * D, cos, sin, D);
            /* runner.write_kv: this token's keys and values into its slot */
            memcpy(k_cache + slot_mapping[t] * slot_size, row + H * D, slot_size * sizeof(SCALAR));
            memcpy(v_cache + slot_mapping[t] * slot_size, row + (H + KV) * D, slot_size * sizeof(SCALAR));
        }
        attend_rows(&att, k_cache, v_cache, bounds, workers);
        linear(gemm, attn, H * D, (const SCALAR *)w[O_PROJ], x, T, hidden, H * D, 1);

        /* x += down_proj(silu(gate) * up), gate and up from one product of rms_norm(x) */
        for (int64_t t = 0; t < T; t++)
            rms_norm(x + t * hidden, (const SCALAR *)w[POST_NORM], xn + t * hidden, hidden, eps);
        linear(gemm, xn, hidden, (const SCALAR *)w[GATE_UP], gate_up, T, 2 * inter, hidden, 0);
        for (int64_t t = 0; t < T; t++) {
            SCALAR *g = gate_up + t * 2 * inter; /* silu(gate) * up overwrites gate */
            const SCALAR *up = g + inter;
            for (int64_t i = 0; i < inter; i++)
                g[i] = g[i] / (1 + EXP(-g[i])) * up[i];
        }
        linear(gemm, gate_up, 2 * inter, (const SCALAR *)w[DOWN], x, T, hidden, inter, 1);
    }

    /* Logits only for the rows that sample. */
    for (int64_t r = 0; r < R; r++)
        rms_norm(x + logit_rows[r] * hidden, final_norm, xn + r * hidden, hidden, eps);
    if (R > 0)
        linear(gemm, xn, hidden, lm_head, logits, R, vocab, hidden, 0);
    free(work);
    free(slots);
    free(row_seq);
    free(bounds);
    return OK;
}
