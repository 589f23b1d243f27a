/* Shared by the context-parallel C examples (c_gqa_cp.c, c_mla_cp.c, c_sfa_cp.c, c_dsa_cp.c): W
 * ranks forked from one program join a gloo group over a TCP rendezvous on 127.0.0.1
 * (aar_cp_comm_create_tcp).
 *
 *   <program>                  forks ranks 0 .. W-1 (rank 0's store takes over a socket the
 *                              parent bound to a free port), waits at most deadline_s
 *   <program> <rank> <port>    one rank, for running them by hand
 *
 * Every process ends with the program: a rank that fails exits at once, its peers' next
 * collective fails within the communicator's timeout, and the parent kills whatever is still
 * running at its deadline. POSIX: the including file defines _POSIX_C_SOURCE 200809L before
 * any include. */
#ifndef AAR_C_CP_HARNESS_H_
#define AAR_C_CP_HARNESS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "c_example.h"

/* What a rank runs once its communicator is made: 1 when every check passed. */
typedef int (*cp_rank_fn)(int rank, aar_cp_comm_t* comm);

/* Rank `rank` of `world`: checks the library's version, joins the group (rank 0 on listen_fd
 * when not -1), checks a bad rank is refused and the communicator's facts, runs body. */
static inline int cp_run_rank(int rank, int world, int port, int listen_fd, int timeout_ms, cp_rank_fn body) {
  if (aar_c_api_version() != AAR_C_API_VERSION) {
    fprintf(stderr, "c_api.h is version %d, libascend_attn_rt_c %d\n", AAR_C_API_VERSION, aar_c_api_version());
    return 1;
  }
  aar_cp_comm_tcp_config_t cc;
  aar_cp_comm_tcp_config_init(&cc);
  cc.host = "127.0.0.1";
  cc.device_host = "127.0.0.1";
  cc.port = port;
  cc.rank = rank;
  cc.world_size = world;
  cc.timeout_ms = timeout_ms;
  cc.listen_fd = rank == 0 ? listen_fd : -1;
  aar_cp_comm_t* comm = NULL;
  int ok = 1;
  {
    char needle[64];
    aar_cp_comm_tcp_config_t bad = cc;
    bad.rank = world;
    bad.listen_fd = -1;
    snprintf(needle, sizeof(needle), "config->rank=%d is out of range", world);
    ok &= expect_rejected(aar_cp_comm_create_tcp(&bad, &comm), needle, "rank world_size");
  }
  CHECK(aar_cp_comm_create_tcp(&cc, &comm));
  aar_cp_comm_info_t info;
  info.struct_size = sizeof(info);
  CHECK(aar_cp_comm_get_info(comm, &info));
  ok = ok && info.rank == rank && info.world_size == world;
  ok = body(rank, comm) && ok;
  aar_cp_comm_destroy(comm);
  printf("rank %d: %s\n", rank, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

/* A listening socket on a free loopback port (the kernel's pick): rank 0's store takes it over
 * (config.listen_fd), so no other process can take the port in between. */
static inline int cp_listen_socket(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof(a)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &len) != 0) {
    perror("listen_socket");
    exit(1);
  }
  *port = ntohs(a.sin_port);
  return fd;
}

/* The program's main: one rank from the command line, or `world` (<= 8) forked ranks. */
static inline int cp_main(int argc, char** argv, int world, int deadline_s, int timeout_ms, cp_rank_fn body,
                          const char* ok_message) {
  if (argc == 3) return cp_run_rank(atoi(argv[1]), world, atoi(argv[2]), -1, timeout_ms, body);
  if (argc != 1 || world < 1 || world > 8) {
    fprintf(stderr, "usage: %s [rank port]\n", argv[0]);
    return 2;
  }
  /* Fork before the runtime is used: a child starts with no runtime threads. */
  int port = 0;
  const int fd = cp_listen_socket(&port);
  pid_t pids[8];
  fflush(stdout);
  for (int r = 0; r < world; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      for (int j = 0; j < r; ++j) kill(pids[j], SIGKILL);
      return 1;
    }
    if (pids[r] == 0) {
      if (r != 0) close(fd); /* the socket is rank 0's */
      const int rc = cp_run_rank(r, world, port, r == 0 ? fd : -1, timeout_ms, body);
      fflush(stdout);
      _exit(rc);
    }
  }
  close(fd); /* rank 0 holds it now */
  int failed = 0, left = world;
  const time_t deadline = time(NULL) + deadline_s;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      int status = 0;
      if (pids[r] <= 0 || waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      const int good = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!good) fprintf(stderr, "rank %d ended with status %d\n", r, status);
      failed |= !good;
      pids[r] = 0;
      --left;
    }
    if (left > 0 && time(NULL) > deadline) {
      fprintf(stderr, "deadline of %d s passed: killing the ranks still running\n", deadline_s);
      for (int r = 0; r < world; ++r) {
        if (pids[r] > 0) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
        }
      }
      return 1;
    }
    if (left > 0) {
      const struct timespec ms50 = {0, 50 * 1000 * 1000};
      nanosleep(&ms50, NULL);
    }
  }
  printf("%s\n", failed ? "FAILED" : ok_message);
  return failed;
}

#endif /* AAR_C_CP_HARNESS_H_ */
