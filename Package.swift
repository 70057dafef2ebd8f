// swift-tools-version:6.0
import PackageDescription

// Layers, bottom up:
//   BLFrame    the 1+7-byte frame codec (no Foundation, no dependencies)
//   CLinux     one-call C wrappers for Linux calls Swift's Glibc module does not declare, and the
//              two libsystemd functions a fully static link of libdbus-1 needs
//   BLCommand  shared command-line support: options, diagnostics, sysexits, fd I/O, the poll loop
//   CDBus      libdbus-1 (pkg-config dbus-1) plus a small shim header
//   BLDBus     D-Bus connection, messages, exported objects, fd passing, wired into the poll loop
//   BLBlueZ    adapters, discovery, devices, remote characteristics, GATT application, advertising
// Tools are thin executables on top.
let package = Package(
    name: "blpipe",
    products: [
        .library(name: "BLFrame", targets: ["BLFrame"]),
        .executable(name: "blframe", targets: ["blframe"]),
        .executable(name: "blscan", targets: ["blscan"]),
        .executable(name: "blsend", targets: ["blsend"]),
        .executable(name: "blrecv", targets: ["blrecv"]),
        .executable(name: "blserve", targets: ["blserve"]),
    ],
    targets: [
        .target(name: "BLFrame"),
        .target(name: "CLinux"),
        .target(name: "BLCommand", dependencies: ["CLinux"]),
        .systemLibrary(
            name: "CDBus",
            pkgConfig: "dbus-1",
            providers: [.apt(["libdbus-1-dev"])]
        ),
        .target(name: "BLDBus", dependencies: ["CDBus", "CLinux", "BLCommand"]),
        .target(name: "BLBlueZ", dependencies: ["BLDBus", "BLCommand", "BLFrame"]),
        .executableTarget(name: "blframe", dependencies: ["BLFrame", "BLCommand"]),
        .executableTarget(name: "blscan", dependencies: ["BLBlueZ", "BLDBus", "BLCommand"]),
        .executableTarget(name: "blsend", dependencies: ["BLBlueZ", "BLDBus", "BLCommand", "BLFrame"]),
        .executableTarget(name: "blrecv", dependencies: ["BLBlueZ", "BLDBus", "BLCommand", "BLFrame"]),
        .executableTarget(name: "blserve", dependencies: ["BLBlueZ", "BLDBus", "BLCommand", "BLFrame"]),
        // Helpers shared by the test targets (seeded randomness, running the built tools).
        .target(name: "CTestSupport", path: "Tests/CTestSupport"),
        .target(name: "BLTestSupport", dependencies: ["BLCommand", "CTestSupport"], path: "Tests/BLTestSupport"),
        .testTarget(name: "BLFrameTests", dependencies: ["BLFrame", "BLTestSupport"]),
        .testTarget(name: "BLCommandTests", dependencies: ["BLCommand", "CLinux", "BLTestSupport"]),
        .testTarget(name: "blframeTests", dependencies: ["blframe", "BLFrame", "BLTestSupport"]),
        .testTarget(name: "BLDBusTests", dependencies: ["BLDBus", "CDBus", "CLinux", "BLCommand", "BLTestSupport"]),
        .testTarget(name: "BLBlueZTests", dependencies: ["BLBlueZ", "BLDBus", "BLCommand", "BLTestSupport"]),
        .testTarget(name: "blscanTests", dependencies: ["blscan", "BLTestSupport"]),
        .testTarget(name: "blsendTests", dependencies: ["blsend", "BLTestSupport"]),
        .testTarget(name: "blrecvTests", dependencies: ["blrecv", "BLTestSupport"]),
        .testTarget(name: "blserveTests", dependencies: ["blserve", "BLBlueZ", "BLDBus", "BLCommand", "BLFrame", "BLTestSupport"]),
    ]
)
