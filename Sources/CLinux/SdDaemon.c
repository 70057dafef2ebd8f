#include "SdDaemon.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define SD_LISTEN_FDS_START 3

// A whole decimal number in 0...max, else -1.
static long parse_count(const char *text, long max) {
    if (text == NULL || *text < '0' || *text > '9') return -1;
    char *end = NULL;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value > (unsigned long)max) return -1;
    return (long)value;
}

int bl_sd_listen_fds(int unset_environment) {
    int result = 0;
    const char *pid_text = getenv("LISTEN_PID");
    if (pid_text != NULL) {
        long pid = parse_count(pid_text, INT_MAX);
        if (pid <= 0) {
            result = -EINVAL;
        } else if ((pid_t)pid == getpid()) {
            const char *fds_text = getenv("LISTEN_FDS");
            long count = parse_count(fds_text, INT_MAX - SD_LISTEN_FDS_START);
            if (count < 0) {
                result = fds_text == NULL ? 0 : -EINVAL;
            } else {
                for (int fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + (int)count; fd++) {
                    int flags = fcntl(fd, F_GETFD);
                    if (flags < 0 || ((flags & FD_CLOEXEC) == 0 && fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0)) {
                        result = -errno;
                        break;
                    }
                }
                if (result == 0) result = (int)count;
            }
        }
    }
    if (unset_environment) {
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
    }
    return result;
}

int bl_sd_is_socket(int fd, int family, int type, int listening) {
    if (fd < 0) return -EBADF;
    if (family < 0) return -EINVAL;
    struct stat info;
    if (fstat(fd, &info) < 0) return -errno;
    if (!S_ISSOCK(info.st_mode)) return 0;
    if (type != 0) {
        int actual = 0;
        socklen_t length = sizeof actual;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &actual, &length) < 0) return -errno;
        if (length != sizeof actual || actual != type) return 0;
    }
    if (listening >= 0) {
        int accepting = 0;
        socklen_t length = sizeof accepting;
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &length) < 0) return -errno;
        if (length != sizeof accepting || (accepting != 0) != (listening != 0)) return 0;
    }
    if (family > 0) {
        struct sockaddr_storage address;
        socklen_t length = sizeof address;
        if (getsockname(fd, (struct sockaddr *)&address, &length) < 0) return -errno;
        if (length < sizeof(sa_family_t) || address.ss_family != family) return 0;
    }
    return 1;
}
