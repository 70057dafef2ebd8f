#ifndef CTESTSUPPORT_H
#define CTESTSUPPORT_H

#include <spawn.h>

// GNU calls the tests' process helper needs, which the Swift Glibc module (built without
// _GNU_SOURCE) does not declare. Each wrapper is one call.

// posix_spawn_file_actions_addchdir_np: the child starts in `dir`.
int cts_spawn_addchdir(posix_spawn_file_actions_t *actions, const char *dir);

// posix_spawn_file_actions_addclosefrom_np (glibc 2.34): the child inherits no descriptor from
// `from` on. ENOSYS where glibc is older.
int cts_spawn_addclosefrom(posix_spawn_file_actions_t *actions, int from);

#endif
