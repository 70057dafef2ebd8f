#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

public enum DirectoryListing {
    /// The names in a directory, without "." and "..".
    public static func names(in path: String) throws(ToolError) -> [String] {
        guard let dir = opendir(path) else { throw ToolError(.ioError, "\(path): \(Errno.current)") }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafePointer(to: &entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: 256) { String(cString: $0) }
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }
}
