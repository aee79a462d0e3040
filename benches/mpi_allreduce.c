/* MPI_Allreduce(float, sum) timed the way collbench times all_reduce: warm-up, barrier, then
 * the mean of `iters` calls, taking the slowest rank. Prints "size_bytes time_us busbw_GBps".
 * Usage: mpi_allreduce MIN_BYTES MAX_BYTES ITERS WARMUP */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* Warm-up calls of a size, as collbench makes them with its default rings: at least `warmup`,
 * and as many as lap strata's slot rings (Config::calls_to_lap_rings: 128 shared-memory slots
 * of 8 KiB, 8 RDMA slots of 512 KiB, a call filling size/n bytes and at least one slot of
 * each), so that both libraries are timed after the same calls. */
static int warmup_calls(int warmup, size_t size, int n) {
    if (warmup == 0) return 0;
    size_t per = size / (size_t)n > 0 ? size / (size_t)n : 1;
    size_t shm = ((size_t)128 * 8192 + per - 1) / per, rdma = ((size_t)8 * (512 << 10) + per - 1) / per;
    if (shm > 128) shm = 128;
    if (rdma > 8) rdma = 8;
    size_t laps = (shm > rdma ? shm : rdma) + 1;
    return (size_t)warmup > laps ? warmup : (int)laps;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc != 5) {
        if (rank == 0) fprintf(stderr, "usage: %s MIN_BYTES MAX_BYTES ITERS WARMUP\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t min = strtoull(argv[1], NULL, 10), max = strtoull(argv[2], NULL, 10);
    int iters = atoi(argv[3]), warmup = atoi(argv[4]);
    float *send = malloc(max > 4 ? max : 4), *recv = malloc(max > 4 ? max : 4);
    if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 3);
    for (size_t i = 0; i < max / 4; i++) send[i] = (float)(rank + 1);
    for (size_t size = min; size <= max; size *= 2) {
        int count = (int)(size / 4);
        int warm = warmup_calls(warmup, size, n);
        for (int i = 0; i < warm; i++) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double us = (MPI_Wtime() - t0) * 1e6 / iters, worst;
        MPI_Allreduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        /* check the last result: sum of (r+1) over ranks */
        float want = (float)(n * (n + 1) / 2);
        int bad = 0;
        for (int i = 0; i < count; i++) bad += recv[i] != want;
        if (bad) { fprintf(stderr, "rank %d: %d wrong elements at %zu bytes\n", rank, bad, size); MPI_Abort(MPI_COMM_WORLD, 4); }
        double busbw = worst > 0 ? (double)size / (worst * 1e-6) / 1e9 * 2.0 * (n - 1) / n : 0.0;
        if (rank == 0) printf("%zu %.3f %.4f\n", size, worst, busbw);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
