#!/usr/bin/env bash
# Packs what scripts/gpu-sim-demo.sh needs on a GPU host without Java into .device/ (under 60 MiB):
# a jlink runtime (jre.txz, ~18 MiB; linked here, see below) and kvferry.jar, trimmed and
# compressed as app/kvferry.jar.xz (~19 MiB). ../shared/tools/device-bundle.sh lays out .device/.
#
# usage (from the repository root):  scripts/gpu-bundle.sh        (SKIP_BUILD=1: use the built jar)
#
# The shaded jar (~48 MiB) is too big as it is. Trimmed from a copy:
#   - native libraries for every platform but linux-x86-64 (JNA, jline, lz4);
#   - lmdbjava with jnr-ffi, jffi and asm: Pekko's durable distributed-data store, which kvferry
#     never configures (no durable keys), so none of it is loaded;
#   - META-INF/maven (build metadata).
# The rest is stored uncompressed in the jar and the jar compressed with xz: one solid stream
# compresses the classes about twice as well as the jar's per-file deflate. The trimmed jar is
# then run here, as on the GPU host (bundled runtime, jar on the classpath), on a short host demo
# (cma), so a class it needs and lost shows up now.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bundler=${DEVICE_BUNDLE:-$root/../shared/tools/device-bundle.sh}
limit_mib=60

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  mvn -B -o -q -Dstyle.color=never -pl cli -am package -DskipTests
fi
jar=cli/target/kvferry.jar
[ -f "$jar" ] || { echo "no $jar: build it first (drop SKIP_BUILD)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$jar" "$work/kvferry.jar" <<'EOF'
import sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
drop_prefixes = ("jnr/", "com/kenai/jffi/", "jni/", "org/lmdbjava/", "org/objectweb/asm/",
                 "META-INF/maven/")
native_suffixes = (".so", ".dll", ".jnilib", ".dylib", ".a")
linux_x86_64 = ("com/sun/jna/linux-x86-64/", "org/jline/nativ/Linux/x86_64/",
                "net/jpountz/util/linux/amd64/")
kept = dropped = 0
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
    names = zin.namelist()
    # The manifest first, as jar tools expect.
    names.sort(key=lambda n: n != "META-INF/MANIFEST.MF")
    for name in names:
        native = name.endswith(native_suffixes) and not name.startswith(linux_x86_64)
        if name.startswith(drop_prefixes) or native:
            dropped += 1
            continue
        info = zin.getinfo(name)
        out = zipfile.ZipInfo(name, info.date_time)
        out.external_attr = info.external_attr
        zout.writestr(out, zin.read(name), zipfile.ZIP_STORED)
        kept += 1
print(f"trimmed jar: kept {kept} entries, dropped {dropped}")
EOF

# Both the bundled runtime and the trimmed jar come from device-bundle.sh's own packing.
xz -6 -T2 -c "$work/kvferry.jar" > "$work/kvferry.jar.xz"
# device-bundle.sh records .device/ in .git/info/exclude, which a git worktree (where .git is a
# file) does not have: record it where git looks, and accept that one step failing there.
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >> "$exclude"
# The bundler's own runtime is replaced below; should it fail, the jar is put in place here.
if ! "$bundler" "$work/kvferry.jar.xz"; then
  mkdir -p .device/app && cp "$work/kvferry.jar.xz" .device/app/
fi

# The runtime is linked here rather than taken from the bundler: with jdk.net (the engine port
# reads its peer's uid through SO_PEERCRED) and without jlink's own zip compression, so that xz
# at the end compresses the class files themselves (about 18 MiB packed instead of 29: the bundle
# travels with the working tree, 64 MiB in all, and the tree's committed results keep growing).
rm -rf "$work/jre" .device/jre.tgz
jlink --add-modules java.base,java.logging,java.management,java.naming,java.xml,java.sql,java.net.http,java.desktop,jdk.unsupported,jdk.crypto.ec,jdk.management,jdk.jfr,jdk.net \
  --strip-debug --no-header-files --no-man-pages --compress=0 --output "$work/jre"

# The GPU JUnit classes CI can only skip, for scripts/gpu-junit.sh: every module's test classes,
# their test-only dependencies and JUnit's console launcher (fetched once from Maven Central).
m2=${MAVEN_REPO:-$HOME/.m2/repository}
junit_platform=1.14.4  # the platform of the JUnit BOM in pom.xml
pekko=$(sed -n 's:.*<pekko.version>\(.*\)</pekko.version>.*:\1:p' pom.xml | head -1)
console=$m2/org/junit/platform/junit-platform-console-standalone/$junit_platform/junit-platform-console-standalone-$junit_platform.jar
[ -f "$console" ] || mvn -B -q dependency:get \
  -Dartifact=org.junit.platform:junit-platform-console-standalone:$junit_platform
rm -rf .device/tests && mkdir -p .device/tests
for module in rdma-jni actors cluster-config sim bench cli; do
  jar cf ".device/tests/kvferry-$module-tests.jar" -C "$module/target/test-classes" .
done
cp "$console" \
  "$m2/org/apache/pekko/pekko-actor-testkit-typed_2.13/$pekko/pekko-actor-testkit-typed_2.13-$pekko.jar" \
  "$m2/org/apache/pekko/pekko-testkit_2.13/$pekko/pekko-testkit_2.13-$pekko.jar" .device/tests/
cp scripts/gpu-env.sh scripts/gpu-sim-demo.sh scripts/gpu-junit.sh scripts/gpu-demo.sh \
  scripts/gpu_torch_peer.py scripts/gpu-actors.sh scripts/gpu-tcp.sh scripts/gpu-model.sh .device/
rm -rf .device/python && mkdir -p .device/python && cp -r python/kvferry .device/python/
find .device/python -name __pycache__ -prune -exec rm -rf {} +

# The trimmed jar on the bundled runtime, on the host path: it must still start and verify.
mkdir -p "$work/run"
cp -r "$work/jre" "$work/run/jre"
echo "smoke test: trimmed jar, bundled runtime, host demo (cma)"
(cd "$work/run" && ./jre/bin/java -cp "$work/kvferry.jar" dev.kvferry.cli.KvferryCli demo \
  --layers 2 --num-blocks-p 64 --num-blocks-d 64 --requests 6 --prompt-tokens 16:200 \
  --abort-rate 0 > "$work/smoke.log" 2>&1) || { tail -30 "$work/smoke.log"; exit 1; }
grep -q "^OK: every byte verified" "$work/smoke.log" || { tail -30 "$work/smoke.log"; exit 1; }
echo "smoke test passed"

# The runtime as xz (jre.txz): one solid stream of uncompressed modules.
tar cf - -C "$work" jre | xz -6 -T2 > .device/jre.txz

size_kib=$(du -sk .device | cut -f1)
du -sh .device/jre.txz .device/app/kvferry.jar.xz
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  echo "bundle is $((size_kib / 1024)) MiB, over the ${limit_mib} MiB limit" >&2
  exit 1
fi
echo "bundle ready: .device/ ($((size_kib / 1024)) MiB); on the GPU host: bash scripts/gpu-sim-demo.sh P_GPU D_GPU"
