// A loopback TCP transfer doing kvferry's tcp rows' work in C: per round, a sender thread writes
// one SIZE-byte region (filled beforehand) and a receiver thread reads it into its own SIZE-byte
// region (touched beforehand), then answers one byte; rounds back to back. CHUNK bytes per
// write/read call (0: the whole rest in one call, as kvferry's contiguous layout does; iperf3
// writes 128 KiB per call). Prints the median GB/s (1e9 bytes per second) of the rounds.
// usage: tcp_equal_work SIZE ROUNDS [CHUNK]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static size_t size;
static int rounds;
static size_t chunk;
static int listener;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static size_t piece(size_t left) { return chunk && left > chunk ? chunk : left; }

static void *receiver(void *unused) {
  (void)unused;
  int fd = accept(listener, NULL, NULL);
  char *dst = malloc(size);
  if (fd < 0 || dst == NULL) { perror("receiver"); exit(1); }
  memset(dst, 1, size);
  for (int r = 0; r < rounds; r++) {
    for (size_t got = 0; got < size;) {
      ssize_t n = read(fd, dst + got, piece(size - got));
      if (n <= 0) { perror("read"); exit(1); }
      got += (size_t)n;
    }
    char ack = 1;
    if (write(fd, &ack, 1) != 1) { perror("ack"); exit(1); }
  }
  return NULL;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s SIZE ROUNDS [CHUNK]\n", argv[0]); return 2; }
  size = strtoull(argv[1], NULL, 10);
  rounds = atoi(argv[2]);
  chunk = argc > 3 ? strtoull(argv[3], NULL, 10) : 0;
  if (size == 0 || rounds <= 0) { fprintf(stderr, "SIZE and ROUNDS must be positive\n"); return 2; }
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0 || bind(listener, (struct sockaddr *)&a, sizeof a) != 0
      || getsockname(listener, (struct sockaddr *)&a, &len) != 0 || listen(listener, 1) != 0) {
    perror("listen");
    return 1;
  }
  pthread_t t;
  int err = pthread_create(&t, NULL, receiver, NULL);
  if (err != 0) { fprintf(stderr, "pthread_create: %s\n", strerror(err)); return 1; }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { perror("connect"); return 1; }
  char *src = malloc(size);
  double *gbps = malloc(sizeof(double) * (size_t)rounds);
  if (src == NULL || gbps == NULL) { perror("malloc"); return 1; }
  for (size_t i = 0; i < size; i++) src[i] = (char)i;
  for (int r = 0; r < rounds; r++) {
    double t0 = now();
    for (size_t put = 0; put < size;) {
      ssize_t n = write(fd, src + put, piece(size - put));
      if (n <= 0) { perror("write"); return 1; }
      put += (size_t)n;
    }
    char ack;
    if (read(fd, &ack, 1) != 1) { perror("ack"); return 1; }
    gbps[r] = (double)size / (now() - t0) / 1e9;
  }
  pthread_join(t, NULL);
  qsort(gbps, (size_t)rounds, sizeof(double), by_value);
  printf("tcp_equal_work size %zu rounds %d chunk %zu: median %.3f GB/s (min %.3f, max %.3f)\n",
         size, rounds, chunk, gbps[rounds / 2], gbps[0], gbps[rounds - 1]);
  return 0;
}
