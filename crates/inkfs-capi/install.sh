#!/bin/sh
# Build libinkfs (release) and install it under PREFIX:
#   PREFIX/lib/libinkfs.so.0.1.0, libinkfs.so.0 and libinkfs.so (links),
#   PREFIX/lib/libinkfs.a, PREFIX/include/inkfs.h,
#   PREFIX/lib/pkgconfig/inkfs.pc
# Usage: crates/inkfs-capi/install.sh PREFIX   (e.g. /usr/local)
# Environment: CARGO (default cargo), CARGO_TARGET_DIR (default the
# workspace's target/), INKFS_NO_BUILD=1 installs what is already built.
set -eu
if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
prefix=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cargo=${CARGO:-cargo}
target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
major=${version%%.*}

if [ "${INKFS_NO_BUILD:-}" != 1 ]; then
  (cd "$root" && "$cargo" build --release -p inkfs-capi)
fi
so=$target/release/libinkfs_capi.so
a=$target/release/libinkfs_capi.a
for f in "$so" "$a" "$here/include/inkfs.h"; do
  [ -f "$f" ] || { echo "$0: $f is missing" >&2; exit 1; }
done

# What a static link needs besides libinkfs.a (the Rust standard
# library's system libraries on this target).
private="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"

install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$so" "$prefix/lib/libinkfs.so.$version"
ln -sf "libinkfs.so.$version" "$prefix/lib/libinkfs.so.$major"
ln -sf "libinkfs.so.$major" "$prefix/lib/libinkfs.so"
install -m 0644 "$a" "$prefix/lib/libinkfs.a"
install -m 0644 "$here/include/inkfs.h" "$prefix/include/inkfs.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" -e "s|@PRIVATE_LIBS@|$private|" \
  "$here/inkfs.pc.in" > "$prefix/lib/pkgconfig/inkfs.pc"
chmod 0644 "$prefix/lib/pkgconfig/inkfs.pc"
echo "installed libinkfs $version under $prefix"
