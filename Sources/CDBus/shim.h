#ifndef CDBUS_SHIM_H
#define CDBUS_SHIM_H

// libdbus-1 for Swift. The package declares this module as
// `.systemLibrary(name: "CDBus", pkgConfig: "dbus-1")`, so pkg-config supplies the include paths
// (/usr/include/dbus-1.0 and the arch-specific dbus-arch-deps.h directory).
#include <dbus/dbus.h>

// WHY: libdbus defines its type codes as casts of character literals, e.g.
// `#define DBUS_TYPE_STRING ((int) 's')`. The Swift importer only imports numeric and string
// literal macros ("only numeric and string macro literals supported"), so every DBUS_TYPE_* code is
// invisible from Swift. `static const int` values are imported as ordinary constants.
// WHEN TO REMOVE: if a future Swift importer evaluates casted character-literal macros.
// The values are fixed by the D-Bus wire protocol and can never change.
static const int CDBus_TYPE_INVALID = DBUS_TYPE_INVALID;          // '\0', end of arguments
static const int CDBus_TYPE_BYTE = DBUS_TYPE_BYTE;                // 'y'
static const int CDBus_TYPE_BOOLEAN = DBUS_TYPE_BOOLEAN;          // 'b'
static const int CDBus_TYPE_INT16 = DBUS_TYPE_INT16;              // 'n'
static const int CDBus_TYPE_UINT16 = DBUS_TYPE_UINT16;            // 'q'
static const int CDBus_TYPE_INT32 = DBUS_TYPE_INT32;              // 'i'
static const int CDBus_TYPE_UINT32 = DBUS_TYPE_UINT32;            // 'u'
static const int CDBus_TYPE_INT64 = DBUS_TYPE_INT64;              // 'x'
static const int CDBus_TYPE_UINT64 = DBUS_TYPE_UINT64;            // 't'
static const int CDBus_TYPE_DOUBLE = DBUS_TYPE_DOUBLE;            // 'd'
static const int CDBus_TYPE_STRING = DBUS_TYPE_STRING;            // 's'
static const int CDBus_TYPE_OBJECT_PATH = DBUS_TYPE_OBJECT_PATH;  // 'o'
static const int CDBus_TYPE_SIGNATURE = DBUS_TYPE_SIGNATURE;      // 'g'
static const int CDBus_TYPE_UNIX_FD = DBUS_TYPE_UNIX_FD;          // 'h'
static const int CDBus_TYPE_ARRAY = DBUS_TYPE_ARRAY;              // 'a'
static const int CDBus_TYPE_VARIANT = DBUS_TYPE_VARIANT;          // 'v'
static const int CDBus_TYPE_STRUCT = DBUS_TYPE_STRUCT;            // 'r' (iterators report it; signatures use '(')
static const int CDBus_TYPE_DICT_ENTRY = DBUS_TYPE_DICT_ENTRY;    // 'e' (iterators report it; signatures use '{')

#endif
