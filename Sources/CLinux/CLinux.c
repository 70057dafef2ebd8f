#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <dirent.h>

#include "CLinux.h"

int cl_rename_noreplace(const char *from, const char *to) {
#ifdef RENAME_NOREPLACE
    return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
#else
    errno = ENOSYS;
    return -1;
#endif
}

int cl_signalfd(int fd, const void *mask) {
    return signalfd(fd, (const sigset_t *)mask, SFD_NONBLOCK | SFD_CLOEXEC);
}

int cl_pipe_cloexec(int fds[2]) {
    return pipe2(fds, O_CLOEXEC);
}

struct spawn_job {
    const char *path;
    int search_path;
    const posix_spawn_file_actions_t *actions;
    const posix_spawnattr_t *attributes;
    char *const *argv;
    char *const *envp;
    int result_fd;
    uint64_t tag;
};

static void *spawn_thread(void *arg) {
    struct spawn_job job = *(struct spawn_job *)arg;
    free(arg);
    pid_t pid = 0;
    int error = job.search_path
        ? posix_spawnp(&pid, job.path, job.actions, job.attributes, job.argv, job.envp)
        : posix_spawn(&pid, job.path, job.actions, job.attributes, job.argv, job.envp);
    struct cl_spawn_result result = { .tag = job.tag, .error = error, .pid = error == 0 ? pid : 0 };
    const char *bytes = (const char *)&result;
    size_t left = sizeof result;
    while (left > 0) {
        ssize_t n = write(job.result_fd, bytes, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        bytes += n;
        left -= (size_t)n;
    }
    return NULL;
}

int cl_spawn_on_thread(const char *path, int search_path, const void *actions, const void *attributes,
                       char *const argv[], char *const envp[], int result_fd, uint64_t tag) {
    struct spawn_job *job = malloc(sizeof *job);
    if (job == NULL) return ENOMEM;
    *job = (struct spawn_job){ path, search_path, actions, attributes, argv, envp, result_fd, tag };
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    if (rc != 0) {
        free(job);
        return rc;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    // posix_spawn runs the child on a stack of its own; this thread needs little.
    pthread_attr_setstacksize(&attr, 256 * 1024);
    // The thread starts with every signal blocked (it inherits this mask), so that no signal
    // meant for the process's loop (SIGCHLD, SIGINT...) is ever delivered to it.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    rc = pthread_create(&thread, &attr, spawn_thread, job);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) free(job);
    return rc;
}

int cl_spawn_close_from(void *actions, int lowest) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    return posix_spawn_file_actions_addclosefrom_np((posix_spawn_file_actions_t *)actions, lowest);
#else
    (void)actions;
    (void)lowest;
    return ENOSYS;
#endif
}

int cl_cloexec_from(int lowest, bool use_close_range) {
#ifdef SYS_close_range
    if (use_close_range && syscall(SYS_close_range, (unsigned)lowest, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */) == 0)
        return 0;
#endif
    // Before Linux 5.11 (or where a sandbox refuses close_range): the descriptors that are open,
    // from /proc.
    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return -1;
    int own = dirfd(dir);
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        char *end;
        long fd = strtol(entry->d_name, &end, 10);
        if (*end != '\0' || end == entry->d_name || fd < lowest || fd == own)
            continue;
        int flags = fcntl((int)fd, F_GETFD);
        if (flags >= 0 && !(flags & FD_CLOEXEC))
            fcntl((int)fd, F_SETFD, flags | FD_CLOEXEC);
    }
    closedir(dir);
    return 0;
}

bool cl_signal_ignored(int signo) {
    struct sigaction current;
    return sigaction(signo, NULL, &current) == 0 && current.sa_handler == SIG_IGN;
}

const char *cl_secure_getenv(const char *name) {
    return secure_getenv(name);
}
