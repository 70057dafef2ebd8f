#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/signalfd.h>

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
