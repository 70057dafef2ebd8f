#ifndef CLINUX_H
#define CLINUX_H

// Linux calls the Swift Glibc module does not show: it is built without _GNU_SOURCE, so glibc's
// GNU extensions (renameat2 among them) are not declared to Swift. Each wrapper here is one call.

// rename(2) that fails with EEXIST instead of replacing `to` (renameat2 with RENAME_NOREPLACE).
// EINVAL or ENOSYS: the file system or kernel does not offer it.
int cl_rename_noreplace(const char *from, const char *to);

// signalfd(2) (<sys/signalfd.h>, which the Glibc module leaves out): creates (fd == -1) or updates
// a signalfd for `mask`, non-blocking and close-on-exec. Returns the descriptor, or -1 and errno.
// `mask` points to a sigset_t.
int cl_signalfd(int fd, const void *mask);

// The sd-daemon functions a fully static libdbus-1 needs.
#include "SdDaemon.h"

#endif
