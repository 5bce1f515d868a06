/* C reference loop for commbench's measurement fidelity check (tools/bench_fidelity.py).
 *
 * Plain blocking MPI_Allreduce (float32 SUM) or MPI_Alltoall (float32), page-aligned
 * buffers (posix_memalign 4096: a 64 KiB all_reduce took ~60 us from malloc'd buffers vs
 * ~21 us page-aligned in Open MPI 5.0.11 on the 2-core loopback), mean time per operation:
 *
 *   back_to_back  nccl-tests: after warm-up and a barrier, time N consecutive operations
 *                 and divide by N.
 *   barrier       OSU osu_allreduce: t_start/t_stop around each operation, summed, with an
 *                 MPI_Barrier after each one outside the timed window.
 *
 * A rank's mean is reduced with MAX over ranks (the slowest rank's mean).
 * nbytes is commbench's S: the whole buffer for all_reduce, the bytes a rank sends
 * (n chunks) for all_to_all.
 *
 * Executable:  mpirun -np 2 build/c_loop [-o all_reduce|all_to_all|both]
 *                  [-m back_to_back|barrier|both] [-b MIN] [-e MAX] [-f FACTOR]
 *                  [-t MIN_TIME_MS] [-n MIN_ITERS] [-x MAX_ITERS] [-i FIXED_ITERS] [-w WARMUP]
 *   prints "# op method nbytes iters mean_us" then one such line per size (rank 0).
 *
 * Shared library (mpicc -shared -fPIC, no main): cb_iters() and cb_loop() take a Fortran
 * communicator handle (mpi4py: comm.py2f()), so a Python driver can call the very same
 * loop in its own ranks, between its own measurements.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OP_ALL_REDUCE = 0, OP_ALL_TO_ALL = 1 };
enum { M_BACK_TO_BACK = 0, M_BARRIER = 1 };

typedef struct {
    MPI_Comm comm;
    int op, size;
    int count;      /* all_reduce: elements; all_to_all: elements per peer */
    float *send, *recv;
} loop_t;

static int loop_open(loop_t *L, MPI_Comm comm, int op, long nbytes)
{
    size_t total;
    memset(L, 0, sizeof *L);
    L->comm = comm;
    L->op = op;
    MPI_Comm_size(comm, &L->size);
    if (nbytes < 4) nbytes = 4;
    if (op == OP_ALL_TO_ALL) {
        L->count = (int)(nbytes / 4 / L->size);
        if (L->count < 1) L->count = 1;
        total = (size_t)L->count * L->size * 4;
    } else {
        L->count = (int)(nbytes / 4);
        total = (size_t)L->count * 4;
    }
    if (posix_memalign((void **)&L->send, 4096, total) || posix_memalign((void **)&L->recv, 4096, total))
        return -1;
    for (size_t i = 0; i < total / 4; i++) {
        L->send[i] = 1.0f;
        L->recv[i] = 0.0f;
    }
    return 0;
}

static void loop_close(loop_t *L)
{
    free(L->send);
    free(L->recv);
}

static inline void loop_op(const loop_t *L)
{
    if (L->op == OP_ALL_TO_ALL)
        MPI_Alltoall(L->send, L->count, MPI_FLOAT, L->recv, L->count, MPI_FLOAT, L->comm);
    else
        MPI_Allreduce(L->send, L->recv, L->count, MPI_FLOAT, MPI_SUM, L->comm);
}

static double max_over_ranks(MPI_Comm comm, double v)
{
    double out;
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm);
    return out;
}

/* Mean seconds per operation, slowest rank's. */
static double loop_time(const loop_t *L, int method, long iters, long warmup)
{
    double total = 0.0;
    for (long i = 0; i < warmup; i++) {
        loop_op(L);
        if (method == M_BARRIER) MPI_Barrier(L->comm);
    }
    MPI_Barrier(L->comm);
    if (method == M_BARRIER) {
        for (long i = 0; i < iters; i++) {
            double t0 = MPI_Wtime();
            loop_op(L);
            total += MPI_Wtime() - t0;
            MPI_Barrier(L->comm);
        }
    } else {
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++)
            loop_op(L);
        total = MPI_Wtime() - t0;
    }
    return max_over_ranks(L->comm, total / (double)iters);
}

/* Iterations so one size lasts about min_time_s: the per-op time is estimated from blocks
 * of doubling length (after `warmup` untimed ops) until a block lasts 2 ms or min_time_s/10;
 * every rank gets the same count. */
static long loop_iters(const loop_t *L, int method, double min_time_s, long min_iters, long max_iters, long warmup)
{
    double target = min_time_s / 10.0 < 2e-3 ? min_time_s / 10.0 : 2e-3, est;
    long k = 1, n;
    for (;;) {
        est = loop_time(L, method, k, k == 1 ? warmup : 0);
        if (est * k >= target || k >= max_iters) break;
        k *= 2;
    }
    n = est > 0 ? (long)(min_time_s / est) + 1 : max_iters;
    if (n < min_iters) n = min_iters;
    if (n > max_iters) n = max_iters;
    return n;
}

/* ---- shared-library entry points (Fortran communicator handles) ---------------------- */

long cb_iters(MPI_Fint fcomm, int op, int method, long nbytes, double min_time_ms, long min_iters,
              long max_iters, long warmup)
{
    loop_t L;
    long n;
    if (loop_open(&L, MPI_Comm_f2c(fcomm), op, nbytes)) return -1;
    n = loop_iters(&L, method, min_time_ms / 1e3, min_iters, max_iters, warmup);
    loop_close(&L);
    return n;
}

/* Mean seconds per op (slowest rank's), or -1 when the buffers could not be allocated. */
double cb_loop(MPI_Fint fcomm, int op, int method, long nbytes, long iters, long warmup)
{
    loop_t L;
    double t;
    if (loop_open(&L, MPI_Comm_f2c(fcomm), op, nbytes)) return -1.0;
    t = loop_time(&L, method, iters, warmup);
    loop_close(&L);
    return t;
}

/* ---- executable ---------------------------------------------------------------------- */
#ifndef CB_NO_MAIN
static const char *OP_NAMES[] = {"all_reduce", "all_to_all"};
static const char *M_NAMES[] = {"back_to_back", "barrier"};

static int pick(const char *arg, const char *const names[], int *lo, int *hi)
{
    if (!strcmp(arg, "both")) { *lo = 0; *hi = 1; return 0; }
    for (int i = 0; i < 2; i++)
        if (!strcmp(arg, names[i])) { *lo = *hi = i; return 0; }
    return -1;
}

static long parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    }
    return (long)v;
}

int main(int argc, char **argv)
{
    int rank, size, op_lo = 0, op_hi = 1, m_lo = 0, m_hi = 1, bad = 0;
    long minb = 8, maxb = 16L << 20, factor = 2, min_iters = 5, max_iters = 1000000, fixed = 0, warmup = 5;
    double min_time_ms = 50.0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v || a[0] != '-' || strlen(a) != 2) { bad = 1; break; }
        i++;
        switch (a[1]) {
        case 'o': bad |= pick(v, OP_NAMES, &op_lo, &op_hi); break;
        case 'm': bad |= pick(v, M_NAMES, &m_lo, &m_hi); break;
        case 'b': minb = parse_size(v); break;
        case 'e': maxb = parse_size(v); break;
        case 'f': factor = atol(v); break;
        case 't': min_time_ms = atof(v); break;
        case 'n': min_iters = atol(v); break;
        case 'x': max_iters = atol(v); break;
        case 'i': fixed = atol(v); break;
        case 'w': warmup = atol(v); break;
        default: bad = 1;
        }
    }
    if (bad || minb < 1 || maxb < minb || factor < 2 || min_iters < 1 || max_iters < min_iters || min_time_ms <= 0) {
        if (rank == 0)
            fprintf(stderr, "usage: %s [-o all_reduce|all_to_all|both] [-m back_to_back|barrier|both] [-b MIN] "
                            "[-e MAX] [-f FACTOR] [-t MIN_TIME_MS] [-n MIN_ITERS] [-x MAX_ITERS] [-i ITERS] [-w WARMUP]\n",
                    argv[0]);
        MPI_Finalize();
        return 2;
    }
    if (rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(lib, &len);
        lib[strcspn(lib, "\n,")] = 0;
        printf("# c_loop: %d ranks, %s\n# op method nbytes iters mean_us\n", size, lib);
        fflush(stdout);
    }
    for (int op = op_lo; op <= op_hi; op++)
        for (int m = m_lo; m <= m_hi; m++)
            for (long nb = minb; nb <= maxb; nb *= factor) {
                loop_t L;
                long iters;
                double t;
                if (loop_open(&L, MPI_COMM_WORLD, op, nb)) {
                    fprintf(stderr, "c_loop: cannot allocate %ld bytes\n", nb);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
                iters = fixed > 0 ? fixed : loop_iters(&L, m, min_time_ms / 1e3, min_iters, max_iters, warmup);
                t = loop_time(&L, m, iters, warmup);
                loop_close(&L);
                if (rank == 0) {
                    printf("%s %s %ld %ld %.4f\n", OP_NAMES[op], M_NAMES[m], nb, iters, t * 1e6);
                    fflush(stdout);
                }
            }
    MPI_Finalize();
    return 0;
}
#endif
