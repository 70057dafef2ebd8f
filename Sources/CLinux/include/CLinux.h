#ifndef CLINUX_H
#define CLINUX_H

// Linux calls the Swift Glibc module does not show: it is built without _GNU_SOURCE, so glibc's
// GNU extensions (renameat2 among them) are not declared to Swift. Each wrapper here is one call,
// except cl_spawn_on_thread, which Swift cannot do without a thread function of C's.

#include <stdbool.h>
#include <stdint.h>

// rename(2) that fails with EEXIST instead of replacing `to` (renameat2 with RENAME_NOREPLACE).
// EINVAL or ENOSYS: the file system or kernel does not offer it.
int cl_rename_noreplace(const char *from, const char *to);

// signalfd(2) (<sys/signalfd.h>, which the Glibc module leaves out): creates (fd == -1) or updates
// a signalfd for `mask`, non-blocking and close-on-exec. Returns the descriptor, or -1 and errno.
// `mask` points to a sigset_t.
int cl_signalfd(int fd, const void *mask);

// pipe2(2) with O_CLOEXEC: both ends close-on-exec from the start, so a child started meanwhile
// by another thread cannot inherit them. Returns 0, or -1 and errno.
int cl_pipe_cloexec(int fds[2]);

// secure_getenv(3): NULL when the process runs with raised privileges (setuid, file
// capabilities), as libdbus reads its bus addresses. Not visible to Swift without _GNU_SOURCE.
const char *cl_secure_getenv(const char *name);

// What cl_spawn_on_thread writes to its `result_fd` when posix_spawn has returned: the caller's
// `tag`, 0 or the errno value posix_spawn(p) returned, and the child's pid.
struct cl_spawn_result {
    uint64_t tag;
    int32_t error;
    int32_t pid;
};

// posix_spawn(3) (posix_spawnp with `search_path`) on a new detached thread, with every signal
// blocked in it, so that the calling thread goes on while the child is created and execs (glibc
// suspends the thread that spawns until then). When posix_spawn returns, the thread writes one
// struct cl_spawn_result (atomically: it is shorter than PIPE_BUF) to `result_fd`, a pipe whose
// write end blocks, and ends.
// `actions` and `attributes` point to a posix_spawn_file_actions_t and a posix_spawnattr_t. They,
// `path`, `argv` and `envp` must stay valid and unchanged until the result has been read.
// Returns 0, or an errno value when the thread cannot be created (nothing was started then).
int cl_spawn_on_thread(const char *path, int search_path, const void *actions, const void *attributes,
                       char *const argv[], char *const envp[], int result_fd, uint64_t tag);

// posix_spawn_file_actions_addclosefrom_np(3) (glibc 2.34): the child closes every descriptor
// from `lowest` up before it execs, also those the process inherited without close-on-exec.
// `actions` points to a posix_spawn_file_actions_t. Returns 0, or an errno value (ENOSYS: this
// C library does not have it).
int cl_spawn_close_from(void *actions, int lowest);

// Makes every descriptor from `lowest` up close-on-exec: where cl_spawn_close_from cannot be used.
// close_range(2) with CLOSE_RANGE_CLOEXEC when `use_close_range` (Linux 5.11) and it works, else
// one fcntl per descriptor listed in /proc/self/fd. Returns 0, or -1 and errno.
int cl_cloexec_from(int lowest, bool use_close_range);

// True when `signo` is ignored (SIG_IGN), as `nohup` or a shell leaves some signals for the
// programs it starts; Swift cannot compare the handler sigaction(2) returns with SIG_IGN.
bool cl_signal_ignored(int signo);

// The sd-daemon functions a fully static libdbus-1 needs.
#include "SdDaemon.h"

#endif
