#!/bin/bash
# tests/dax-vm/guest-test.sh — runs as PID 1 inside the QEMU guest (see run).
#
# The host shares a directory over virtio-9p, mounted at /share:
#   /share/guest/phase          boot1 (fresh NVDIMM) or boot2 (after power-off)
#   /share/guest/probe          static probe (probe.c)
#   /share/guest/inkfs          the inkfs binary, if one was given
#   /share/guest/require-inkfs  1: inkfs cases that would be SKIPPED FAIL instead
#   /share/out/results          one line per case: PASS|FAIL|SKIPPED PHASE NAME[: why]
#   /share/out/PHASE.rc         0 when no case of this boot failed
# Everything printed here goes to the serial console, which the host shows.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LC_ALL=C
SHARE=/share
G=$SHARE/guest
OUT=$SHARE/out
PHASE=$(cat "$G/phase" 2>/dev/null || echo unknown)
PROBE=$G/probe
INKFS=$G/inkfs
REQUIRE_INKFS=$(cat "$G/require-inkfs" 2>/dev/null || echo 0)
FAILS=0

echo "guest: ready after $(cut -d' ' -f1 /proc/uptime) s (phase $PHASE, kernel $(uname -r))"
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /mnt/ext4 /mnt/xfs /mnt/inkfs

finish() {
	local m
	for m in /mnt/inkfs /mnt/ext4 /mnt/xfs; do
		mountpoint -q "$m" && { umount "$m" || echo "guest: WARNING: umount $m failed"; }
	done
	echo "$([[ $FAILS == 0 ]] && echo 0 || echo 1)" >"$OUT/$PHASE.rc"
	sync
	echo "guest: $PHASE done at $(cut -d' ' -f1 /proc/uptime) s, $FAILS failure(s); powering off"
	/usr/local/bin/busybox poweroff -f
	sleep 10
}

# ---------------------------------------------------------------- reporting
result() { # result PASS|FAIL|SKIPPED NAME [WHY]
	local line="$1 $PHASE $2${3:+: $3}"
	echo "$line" >>"$OUT/results"
	echo "guest: ==> $line"
	[[ $1 == FAIL ]] && FAILS=$((FAILS + 1))
	return 0
}

# check NAME CMD...: run CMD (a function or program), show its output, PASS
# when it exits 0, else FAIL with the last line it printed.
check() {
	local name=$1 rc out
	shift
	echo "guest: --- $name: $*"
	out=$("$@" 2>&1)
	rc=$?
	[[ -n $out ]] && printf '%s\n' "$out" | sed 's/^/    /'
	if [[ $rc == 0 ]]; then
		result PASS "$name"
	else
		result FAIL "$name" "exit $rc: $(printf '%s\n' "$out" | grep -v '^$' | tail -1)"
	fi
	return $rc
}

# probe wrapper that also prints the command
probe() { echo "+ probe $*"; "$PROBE" "$@"; }
sh_x() { echo "+ $*"; "$@"; }

# ------------------------------------------------------ NVDIMM namespaces
# One 2 GiB region, labelled, holding four namespaces (found by name later;
# created in this order, so the device names below are the usual ones):
#   pool  devdax 512M  /dev/dax0.0   the inkfs pool on device DAX
#   ext4  fsdax  768M  /dev/pmem0.1  ext4 -o dax (probe files, inkfs pool file)
#   xfs   fsdax  512M  /dev/pmem0.2  xfs -o dax (probe files)
#   probe devdax rest  /dev/dax0.3   probe only
ns_json() { ndctl list -N 2>/dev/null | jq -c 'if type == "array" then .[] else . end'; }
ns_field() { ns_json | jq -r --arg n "$1" --arg f "$2" 'select(.name == $n) | .[$f] // empty'; }

setup_namespaces() {
	sh_x ndctl disable-region all || return 1
	sh_x ndctl init-labels -f all || return 1
	sh_x ndctl enable-region all || return 1
	sh_x ndctl create-namespace -r region0 -m devdax -s 512M -n pool || return 1
	sh_x ndctl create-namespace -r region0 -m fsdax --map=mem -s 768M -n ext4 || return 1
	sh_x ndctl create-namespace -r region0 -m fsdax --map=mem -s 512M -n xfs || return 1
	sh_x ndctl create-namespace -r region0 -m devdax -n probe || return 1
	show_namespaces
}

show_namespaces() {
	local n
	ns_json | jq -r '"    \(.name // "-")\t\(.dev)\t\(.mode)\t\(.size / 1048576 | floor) MiB\t\(.blockdev // .chardev // "-")"'
	for n in ext4:fsdax xfs:fsdax probe:devdax pool:devdax; do
		[[ $(ns_field "${n%%:*}" mode) == "${n#*:}" ]] || { echo "namespace ${n%%:*} is not ${n#*:}"; return 1; }
	done
}

# ------------------------------------------------------------ probe cases
probe_devdax() {
	probe rw "$DAX_PROBE" --sync yes || return 1
	probe rw "$DAX_PROBE" --sync yes --flush clflushopt --len 2M --seed 2 || return 1
	probe rw "$DAX_PROBE" --sync yes --flush clflush --len 2M --seed 3
}

fs_mount() { # fs_mount DEV MNT OPTS : mount and check whether DAX is on
	local dev=$1 mnt=$2 opts=$3
	sh_x mount -o "$opts" "$dev" "$mnt" || return 1
	local got
	got=$(awk -v m="$mnt" '$2 == m { print $3 " " $4 }' /proc/mounts)
	echo "    mounted: $got"
	case $opts in
	*dax=never*) [[ $got != *dax,* && $got != *dax\ * && $got != *dax=always* ]] || { echo "DAX is on but should not be"; return 1; } ;;
	*dax*) [[ $got == *dax* && $got != *dax=never* ]] || { echo "mounted without DAX: $got"; return 1; } ;;
	esac
}

probe_ext4_dax_boot1() {
	sh_x mkfs.ext4 -q -F -b 4096 "$PMEM_EXT4" || return 1
	fs_mount "$PMEM_EXT4" /mnt/ext4 dax || return 1
	probe rw /mnt/ext4/probe-rw.dat --sync yes || return 1
	probe write /mnt/ext4/persist.dat --sync yes --len 8M --seed 43
}

probe_ext4_nodax() {
	sh_x umount /mnt/ext4 || return 1
	fs_mount "$PMEM_EXT4" /mnt/ext4 dax=never || return 1
	# the same files, now through the page cache: MAP_SYNC must be refused
	probe rw /mnt/ext4/probe-rw.dat --sync no --seed 5 || return 1
	probe verify /mnt/ext4/persist.dat --sync no --len 8M --seed 43 || return 1
	sh_x umount /mnt/ext4 || return 1
	fs_mount "$PMEM_EXT4" /mnt/ext4 dax
}

probe_xfs_dax_boot1() {
	sh_x mkfs.xfs -q -f -m reflink=0 "$PMEM_XFS" || return 1
	fs_mount "$PMEM_XFS" /mnt/xfs dax || return 1
	probe rw /mnt/xfs/probe-rw.dat --sync yes || return 1
	probe write /mnt/xfs/persist.dat --sync yes --len 8M --seed 44 || return 1
	sh_x umount /mnt/xfs
}

probe_persist_boot2() {
	probe verify "$DAX_PROBE" --sync yes --offset 8M --len 8M --seed 42
}
ext4_boot2() {
	sh_x e2fsck -fn "$PMEM_EXT4" || return 1
	fs_mount "$PMEM_EXT4" /mnt/ext4 dax || return 1
	probe verify /mnt/ext4/persist.dat --sync yes --len 8M --seed 43
}
xfs_boot2() {
	sh_x xfs_repair -n "$PMEM_XFS" || return 1
	fs_mount "$PMEM_XFS" /mnt/xfs dax || return 1
	probe verify /mnt/xfs/persist.dat --sync yes --len 8M --seed 44 || return 1
	sh_x umount /mnt/xfs
}

# =================== inkfs workload: edit here to extend ===================
# Runs once per backend and boot, with these set by the caller:
#   BACKEND      devdax | fsdax | nodax
#   POOL         the pool path (/dev/daxN.M, or a file on /mnt/ext4)
#   MKFS_ARGS    extra arguments for `inkfs mkfs`
#   BACKEND_RE   regex `inkfs stat` must print for the backend
#   FLUSH_RE     regex `inkfs stat` must print for the flush method
# `step NAME [--expect REGEX]... -- inkfs SUBCOMMAND ARGS...` runs one
# command. If the binary lacks SUBCOMMAND (`inkfs SUBCOMMAND --help` fails),
# the step is SKIPPED with the reason (FAIL with --require-inkfs); otherwise
# it must exit 0 within 300 s and print something matching every REGEX.
# `mount_workload write|verify` mounts the pool with `inkfs mount` (FUSE),
# writes files and records their checksums on the share, or checks them.
inkfs_boot1() {
	case $BACKEND in
	devdax | fsdax)
		step mkfs -- inkfs mkfs "$POOL" $MKFS_ARGS --force
		step stat --expect "$BACKEND_RE" --expect "$FLUSH_RE" -- inkfs stat "$POOL"
		step fsck -- inkfs fsck "$POOL"
		step selftest -- inkfs selftest "$POOL"
		mount_workload write
		mount_workload verify # clean unmount, mount again, contents checked
		step fsck-after -- inkfs fsck "$POOL"
		;;
	nodax) # the fsdax pool file, its file system remounted without DAX
		step stat --expect "$BACKEND_RE" --expect "$FLUSH_RE" -- inkfs stat "$POOL"
		step fsck -- inkfs fsck "$POOL"
		mount_workload verify
		;;
	esac
}
inkfs_boot2() {
	case $BACKEND in
	devdax | fsdax)
		step fsck -- inkfs fsck "$POOL"
		step stat --expect "$BACKEND_RE" --expect "$FLUSH_RE" -- inkfs stat "$POOL"
		mount_workload verify
		;;
	nodax) ;;
	esac
}
# ==========================================================================

STEP_BLOCKED=
have_sub() { # have_sub SUB: does the inkfs binary know this subcommand?
	local out
	out=$("$INKFS" "$1" --help 2>&1) && return 0
	WHY="the inkfs binary lacks subcommand '$1' ('inkfs $1 --help' failed: $(printf '%s\n' "$out" | head -1))"
	return 1
}
skip_or_fail() { # NAME WHY
	if [[ $REQUIRE_INKFS == 1 ]]; then result FAIL "$1" "$2 (--require-inkfs)"; else result SKIPPED "$1" "$2"; fi
}
step() {
	local name=inkfs.$BACKEND.$1 expects=() out rc re
	shift
	while [[ $# -gt 1 && $1 == --expect ]]; do expects+=("$2"); shift 2; done
	[[ ${1:-} == -- ]] || { result FAIL "$name" "bad step syntax in guest-test.sh (want: step NAME [--expect RE]... -- inkfs SUB ARGS)"; return 0; }
	shift
	[[ $1 == inkfs ]] && shift
	if [[ -n $STEP_BLOCKED ]]; then
		echo "guest: --- $name: not run ($STEP_BLOCKED failed earlier)"
		return 0
	fi
	have_sub "$1" || { skip_or_fail "$name" "$WHY"; return 0; }
	echo "guest: --- $name: inkfs $*"
	out=$(timeout 300 "$INKFS" "$@" 2>&1)
	rc=$?
	[[ -n $out ]] && printf '%s\n' "$out" | sed 's/^/    /'
	if [[ $rc != 0 ]]; then
		result FAIL "$name" "inkfs $1 exited $rc: $(printf '%s\n' "$out" | grep -v '^$' | tail -1)"
		STEP_BLOCKED=$name
		return 0
	fi
	for re in "${expects[@]}"; do
		grep -Eq -- "$re" <<<"$out" || { result FAIL "$name" "output lacks /$re/"; STEP_BLOCKED=$name; return 0; }
	done
	result PASS "$name"
}

mount_workload() { # write | verify
	local mode=$1 name=inkfs.$BACKEND.mount-$1 sums=$OUT/inkfs-$BACKEND_DATA.sums pid i
	[[ -n $STEP_BLOCKED ]] && { echo "guest: --- $name: not run ($STEP_BLOCKED failed earlier)"; return 0; }
	have_sub mount || { skip_or_fail "$name" "$WHY"; return 0; }
	echo "guest: --- $name: inkfs mount $POOL /mnt/inkfs"
	"$INKFS" mount "$POOL" /mnt/inkfs &
	pid=$!
	for i in $(seq 600); do
		awk '$2 == "/mnt/inkfs" { f = 1 } END { exit !f }' /proc/mounts && break
		kill -0 $pid 2>/dev/null || break
		sleep 0.1
	done
	if ! mountpoint -q /mnt/inkfs; then
		kill $pid 2>/dev/null
		result FAIL "$name" "inkfs mount did not mount /mnt/inkfs within 60 s"
		STEP_BLOCKED=$name
		return 0
	fi
	local ok=1 why=
	if [[ $mode == write ]]; then
		(
			set -e
			cd /mnt/inkfs
			mkdir -p d1/d2
			: >empty
			head -c 1 /dev/urandom >one
			head -c 4095 /dev/urandom >d1/page-1
			head -c 4096 /dev/urandom >d1/page
			head -c 1048577 /dev/urandom >d1/d2/big
			echo hello >d1/d2/small
			mv d1/d2/small d1/renamed
			ln d1/page d1/page-link
			sync
			find . -type f | sort | xargs sha256sum >"$sums"
		) || { ok=0; why="workload commands failed"; }
	else
		(cd /mnt/inkfs && sha256sum -c --quiet "$sums") || { ok=0; why="checksums differ from those written in boot1 ($sums)"; }
	fi
	umount /mnt/inkfs || { ok=0; why="${why:+$why; }umount failed"; }
	for i in $(seq 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
	kill -0 $pid 2>/dev/null && { kill $pid; ok=0; why="${why:+$why; }daemon still running 30 s after umount"; }
	wait $pid 2>/dev/null
	local drc=$?
	[[ $drc == 0 ]] || { ok=0; why="${why:+$why; }inkfs mount exited $drc"; }
	if [[ $ok == 1 ]]; then result PASS "$name"; else result FAIL "$name" "$why"; STEP_BLOCKED=$name; fi
}

run_inkfs() { # run_inkfs BACKEND : set the backend variables, run the workload
	BACKEND=$1
	STEP_BLOCKED=
	case $BACKEND in
	devdax)
		POOL=/dev/$DAX_POOL MKFS_ARGS= BACKEND_RE='device DAX' FLUSH_RE='clwb' BACKEND_DATA=devdax ;;
	fsdax)
		POOL=/mnt/ext4/inkfs.pool MKFS_ARGS='--size 256M' BACKEND_RE='MAP_SYNC' FLUSH_RE='clwb' BACKEND_DATA=fsdax ;;
	nodax)
		POOL=/mnt/ext4/inkfs.pool MKFS_ARGS= BACKEND_RE='msync' FLUSH_RE='msync' BACKEND_DATA=fsdax ;;
	esac
	if [[ ! -x $INKFS ]]; then
		skip_or_fail "inkfs.$BACKEND" "no inkfs binary given (tests/dax-vm/run --inkfs PATH or INKFS_BIN)"
		return 0
	fi
	local out rc
	out=$("$INKFS" --help 2>&1)
	rc=$?
	if [[ $rc == 126 || $rc == 127 ]]; then # the loader or exec failed: not a missing subcommand
		result FAIL "inkfs.$BACKEND" "the inkfs binary cannot run in the guest (exit $rc: $(head -1 <<<"$out"))"
		return 0
	fi
	echo "guest: === inkfs on $BACKEND: $POOL"
	"inkfs_$PHASE"
}

# ------------------------------------------------------------------- main
main() {
	echo "guest: cpu flags: $(grep -m1 -o -w -E 'clwb|clflushopt|clflush|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
	echo "guest: $(ndctl --version 2>&1 | sed 's/^/ndctl /'), $(mkfs.xfs -V 2>&1 | head -1), $(mke2fs -V 2>&1 | head -1)"
	echo "guest: /dev/fuse $([[ -c /dev/fuse ]] && echo present || echo MISSING), modules: $(cut -d' ' -f1 /proc/modules | grep -E '^(nfit|libnvdimm|nd_pmem|dax_pmem|device_dax|ext4|xfs|9p|fuse)$' | sort | tr '\n' ' ')"
	[[ -e /sys/bus/nd/devices/region0 ]] || { result FAIL nvdimm "no NVDIMM region (nfit/libnvdimm not loaded or no NVDIMM device)"; return; }
	if [[ $PHASE == boot1 ]]; then
		check namespaces setup_namespaces || return
	else
		check namespaces-after-reboot show_namespaces || return
	fi
	DAX_PROBE=/dev/$(ns_field probe chardev)
	DAX_POOL=$(ns_field pool chardev)
	PMEM_EXT4=/dev/$(ns_field ext4 blockdev)
	PMEM_XFS=/dev/$(ns_field xfs blockdev)
	echo "guest: devdax probe=$DAX_PROBE pool=/dev/$DAX_POOL; fsdax ext4=$PMEM_EXT4 xfs=$PMEM_XFS"

	if [[ $PHASE == boot1 ]]; then
		check probe.devdax probe_devdax
		check probe.devdax.persist-write probe write "$DAX_PROBE" --sync yes --offset 8M --len 8M --seed 42
		check probe.xfs-dax probe_xfs_dax_boot1
		if check probe.ext4-dax probe_ext4_dax_boot1; then
			check probe.ext4-nodax probe_ext4_nodax
		fi
		run_inkfs devdax
		if mountpoint -q /mnt/ext4; then
			run_inkfs fsdax
			umount /mnt/ext4 && fs_mount "$PMEM_EXT4" /mnt/ext4 dax=never >/dev/null && run_inkfs nodax
			umount /mnt/ext4
		fi
		sh_x ndctl list -N >/dev/null
	else
		check probe.devdax.persist-verify probe_persist_boot2
		check probe.xfs-dax.persist-verify xfs_boot2
		if check probe.ext4-dax.persist-verify ext4_boot2; then
			run_inkfs fsdax
		fi
		run_inkfs devdax
		mountpoint -q /mnt/ext4 && umount /mnt/ext4
		mountpoint -q /mnt/ext4 || check ext4.fsck-after-reboot sh_x e2fsck -fn "$PMEM_EXT4"
	fi
}

if [[ $PHASE == shell ]]; then # tests/dax-vm/run --shell: interactive, for debugging
	echo "guest: interactive shell (NVDIMM as left by the last boot; 'exit' powers off)"
	setsid -c bash -i </dev/ttyS0 >/dev/ttyS0 2>&1
	finish
fi
main
finish
