#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>

#include "CLinux.h"

int cl_rename_noreplace(const char *from, const char *to) {
#ifdef RENAME_NOREPLACE
    return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
#else
    errno = ENOSYS;
    return -1;
#endif
}
