/* The peer for roofline's MPI allreduce ceiling: a plain loop calling MPI_Allreduce on f32
 * buffers, timed the same way as roofline (a barrier, then each iteration timed on every rank,
 * the iteration's time the maximum over ranks) and reported the same way (busbw = algbw ×
 * 2(n-1)/n; best and median of the iterations).
 *
 *   mpicc -O2 -o mpi_allreduce scripts/mpi_allreduce.c
 *   mpirun -np 2 ./mpi_allreduce 16777216 33554432 67108864
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    for (int a = 1; a < argc; ++a) {
        long bytes = atol(argv[a]);
        long count = bytes / 4;
        float *send = malloc(count * sizeof(float)), *recv = malloc(count * sizeof(float));
        for (long i = 0; i < count; ++i) send[i] = (float)((rank * 7 + i * 3) % 17);
        /* roofline's iteration count for this size: (256 MiB / size) clamped to [10, 200] */
        long iters = (256L << 20) / bytes;
        if (iters < 10) iters = 10;
        if (iters > 200) iters = 200;
        double *t = malloc(iters * sizeof(double)), *tmax = malloc(iters * sizeof(double));
        for (int w = 0; w < 2; ++w) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (long it = 0; it < iters; ++it) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            t[it] = MPI_Wtime() - t0;
        }
        MPI_Allreduce(t, tmax, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        qsort(tmax, iters, sizeof(double), cmp);
        double factor = 2.0 * (n - 1) / n;
        if (rank == 0)
            printf("%ld %.6e %.6e\n", bytes, bytes / tmax[0] * factor, bytes / tmax[iters / 2] * factor);
        free(send); free(recv); free(t); free(tmax);
    }
    MPI_Finalize();
    return 0;
}
