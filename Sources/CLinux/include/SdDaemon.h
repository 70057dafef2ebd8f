#ifndef BL_SDDAEMON_H
#define BL_SDDAEMON_H

// What a fully static link of libdbus-1 needs besides libdbus-1.a.
//
// Debian's libdbus-1 is built with systemd support: its socket-activation path (a D-Bus server
// listening on a `systemd:` address) calls sd_listen_fds() and sd_is_socket() from libsystemd,
// which Debian ships only as a shared library. The tools link libdbus-1.a and everything else
// statically (`make build`), so they start without loading libsystemd and the seven libraries
// it brings; the link maps the two names onto these functions (`--defsym`, in the Makefile).
// Builds that link libdbus dynamically (debug builds, the tests) keep libsystemd's and do not
// use these names.
//
// Both follow sd_listen_fds(3) and sd_is_socket(3): the sd-daemon protocol is a pair of
// environment variables and a few descriptor checks. The tools never listen, so libdbus never
// calls them there; they are implemented in full all the same rather than stubbed.

// The number of descriptors passed by socket activation (starting at 3), marked close-on-exec;
// 0 when none were passed to this process; -EINVAL for malformed variables. Nonzero
// `unset_environment` removes LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES.
int bl_sd_listen_fds(int unset_environment);

// 1 if `fd` is a socket of `family` (0: any), `type` (0: any) and, for `listening` >= 0, listening
// or not as asked; 0 if not; a negative errno value on failure.
int bl_sd_is_socket(int fd, int family, int type, int listening);

#endif
