# shellcheck shell=sh
# vnvme-zns.sh - guest test (run-vnvme-tests.sh zns): a zoned namespace as Linux sees it. The server:
# --ns 64M:ram --ns 128M:ram,zoned,zone-size=2M,max-open=4,max-active=6,zone-ext=64 --control SOCK (64 zones
# of 512 4 KiB blocks, 64-byte zone descriptor extensions). At each "ZNS-ASK <step>" line the host runs
# `vnvme ctl zone_set_state` (run-vnvme-tests.sh t_zns): 1 zone 40 read only, 2 zone 41 offline, 3 zone 42
# finished by the controller.
#   * NSID 2's /sys/block/nvme0nY/queue/zoned is host-managed, chunk_sectors the zone size, nr_zones 64,
#     max_open_zones 4, max_active_zones 6; nvme zns id-ns: MOR 3, MAR 5, zsze 512; id-ctrl ZASL nonzero
#   * 1 MiB written with dd at zone 1: blkzone report and nvme zns report-zones both show its write
#     pointer 256 blocks in, implicitly open; blkzone reset of that zone empties it; report-zones --state=2
#     then lists none; changed-zone-list is empty (no zone changed by the controller yet)
#   * nvme write at an LBA that is not the write pointer: Zone Invalid Write (1bch); nvme zns zone-append
#     twice: appended at the zone start, then 1 block after it
#   * nvme zns open-zone: 4 zones open, the 5th Too Many Open Zones (1beh); closed, 2 more open, the 7th
#     active Too Many Active Zones (1bdh); reset-zone --select-all empties them all
#   * fio --zonemode=zbd randwrite 4 KiB with crc32c verify, 64 MiB over the zones at io_uring QD 8 with
#     --max_open_zones=4: passes, and blkzone report shows at least 16 zones written; blkzone reset (all)
#   * descriptor extensions: id-ns zdes 1; set-zone-desc on empty zone 30 closes it (blkzone: cl); again:
#     Invalid Zone State Transition (1bfh); report-zones --extended returns the 64 bytes after its
#     descriptor with attribute ZDEV (80h); reset-zone clears both
#   * zones failed by the host: with Zone Descriptor Changed Notices enabled (set-feature 0Bh bit 27),
#     step 1 makes zone 40 read only: dmesg shows Linux's "async event result 00bfef02", blkzone shows it
#     (ro), changed-zone-list --rae and then without lists it, then is empty; nvme write there is Zone Is
#     Read Only (1bah), a read succeeds; step 2 takes zone 41 offline: blkzone (of), report-zones state
#     Fh, write and read Zone Is Offline (1bbh), listed in changed-zone-list; step 3 finishes open zone 42:
#     blkzone (fu), report-zones attribute ZFC (1), a write is Zone Is Full (1b9h)
#   * no nvme timeouts, resets or aborts in dmesg
. /guest-lib.sh
rc=0
fail() { echo "TEST: FAIL: $*"; rc=1; }

field() { grep -E "^$1[[:space:]]*:" "$2" | head -1 | sed 's/^[^:]*: *//; s/ *$//'; }
# zone_line N: blkzone's report line of zone N (512 4 KiB blocks = 4096 sectors each)
zone_line() { blkzone report -o $(($1 * 4096)) -c 1 "$dev" 2>&1; }
# bytes N [SKIP] < FILE: N bytes from offset SKIP as hex, space separated
bytes() { od -An -v -tx1 -j "${2:-0}" -N "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }
# changed_zones [--rae]: the zone identifiers (decimal) of NSID 2's Changed Zone List, one per line
changed_zones() {
  nvme zns changed-zone-list "$dev" "$@" -o binary > /tmp/czl 2>/dev/null || { echo "error"; return; }
  _n=$(od -An -tu2 -N2 /tmp/czl | tr -d ' ')
  [ "$_n" = 65535 ] && { echo "overflow"; return; }
  _i=0
  while [ "$_i" -lt "${_n:-0}" ]; do
    set -- $(od -An -tu4 -j $((8 + _i * 8)) -N8 /tmp/czl)
    echo $(($1 + ($2 << 32))); _i=$((_i + 1))
  done
}
# zone_report SLBA [1]: Zone Management Receive (7Ah) of the one zone at SLBA, raw into /tmp/zr: the 64-byte
# header, the zone's descriptor, with 1 its 64-byte extension (Extended Report Zones). Through io-passthru:
# nvme-cli 2.3's report-zones -o binary is not the report the device sent (205 bytes for one extended
# zone, zeroes where the state and attributes are; blkzone shows them right), 2.13's is.
zone_report() {
  _ext=${2:-0}
  # CDW12 NUMD (0's based dwords), CDW13: ZRA (bits 7:0, 01h extended), ZRASF 0 (all), Partial Report (16)
  nvme io-passthru "$dev" --opcode=0x7a --namespace-id=2 --cdw10=$(($1 & 0xffffffff)) --cdw11=$(($1 >> 32)) \
    --cdw12=$(((128 + 64 * _ext) / 4 - 1)) --cdw13=$((_ext | (1 << 16))) --data-len=$((128 + 64 * _ext)) \
    --read --raw-binary > /tmp/zr 2> /tmp/zr.err || fail "zone management receive at $1: $(cat /tmp/zr.err)"
}
# nvme_wp SLBA: the write pointer nvme zns report-zones gives for the zone at SLBA
nvme_wp() { nvme zns report-zones "$dev" -s "$1" -d 1 2>&1 | sed -n 's/.*WP: *\(0x[0-9a-fA-F]*\).*/\1/p' | head -1; }

# Linux scans namespaces in parallel: nvme0nY is numbered as found, not by NSID. The zoned one is NSID 2.
wait_nvme 15 /dev/nvme0n1 && wait_nvme 15 /dev/nvme0n2 || die "the two namespaces did not appear"
by_nsid() { for d in /sys/block/nvme0n*; do [ "$(cat "$d/nsid" 2>/dev/null)" = "$1" ] && basename "$d"; done; }
zname=$(by_nsid 2); cname=$(by_nsid 1)
[ -n "$zname" ] && [ -n "$cname" ] || die "no block device with NSID 2 and 1 ($(ls /sys/block))"
dev=/dev/$zname q=/sys/block/$zname/queue
log "NSID 2 (zoned) is $dev, NSID 1 is /dev/$cname"

zoned=$(cat $q/zoned); chunk=$(cat $q/chunk_sectors); nr=$(cat $q/nr_zones 2>/dev/null)
mo=$(cat $q/max_open_zones 2>/dev/null); ma=$(cat $q/max_active_zones 2>/dev/null)
log "sysfs: zoned $zoned chunk_sectors $chunk nr_zones $nr max_open_zones $mo max_active_zones $ma"
[ "$zoned" = host-managed ] || fail "queue/zoned is '$zoned', expected host-managed"
[ "$chunk" = 4096 ] || fail "chunk_sectors $chunk, expected 4096 (2 MiB zones)"
[ "$nr" = 64 ] || fail "nr_zones '$nr', expected 64"
[ "$mo" = 4 ] && [ "$ma" = 6 ] || fail "max_open_zones '$mo' max_active_zones '$ma', expected 4 and 6"
[ "$(cat "/sys/block/$cname/queue/zoned")" = none ] || fail "/dev/$cname (NSID 1) is not a conventional device"

expect_ok zns id-ns "$dev"
echo "$OUT" > /tmp/zns-id-ns
mor=$(field mor /tmp/zns-id-ns); mar=$(field mar /tmp/zns-id-ns)
[ "$((mor))" = 3 ] && [ "$((mar))" = 5 ] || fail "zns id-ns MOR '$mor' MAR '$mar', expected 3 and 5"
echo "$OUT" | grep -q 'zsze:0x200' || fail "zns id-ns has no LBA format extension with zsze 0x200"
expect_ok zns id-ctrl "$dev"
zasl=$(echo "$OUT" | sed -n 's/^zasl *: *//p')
[ "${zasl:-0}" -gt 0 ] || fail "zns id-ctrl ZASL '$zasl'"

# a write, seen by both reports; a reset
dd if=/dev/urandom of=/tmp/mib bs=1M count=1 2>/dev/null
dd if=/tmp/mib of="$dev" bs=1M seek=2 count=1 oflag=direct 2>/tmp/dd.err || fail "dd to zone 1: $(cat /tmp/dd.err)"
line=$(zone_line 1); log "blkzone report zone 1: $line"
echo "$line" | grep -q 'wptr 0x000800' || fail "blkzone: zone 1 write pointer is not 0x800 sectors in: $line"
echo "$line" | grep -q '(oi)' || fail "blkzone: zone 1 is not implicitly open: $line"
wp=$(nvme_wp 512); log "nvme zns report-zones zone 1 WP: $wp"
[ "$((wp))" = 768 ] || fail "nvme zns report-zones: zone 1 WP '$wp', expected 0x300"
dd if="$dev" of=/tmp/back bs=1M skip=2 count=1 iflag=direct 2>/dev/null && cmp /tmp/mib /tmp/back \
  || fail "zone 1 does not read back what was written"
blkzone reset -o 4096 -c 1 "$dev" || fail "blkzone reset of zone 1"
line=$(zone_line 1); log "after reset: $line"
echo "$line" | grep -q 'wptr 0x000000' && echo "$line" | grep -q '(em)' || fail "zone 1 not empty after reset: $line"
wp=$(nvme_wp 512); [ "$((wp))" = 512 ] || fail "nvme zns report-zones: zone 1 WP '$wp' after reset, expected 0x200"

# report filters; the changed zone list is empty until the host fails a zone (below)
expect_ok zns report-zones "$dev" --state=2
echo "$OUT" | grep -q 'nr_zones: 0' || fail "report-zones --state=2 (implicitly open) lists zones after the reset"
expect_ok zns changed-zone-list "$dev"
[ "$(changed_zones)" = "" ] || fail "changed-zone-list is not empty: $OUT"

# Zone Invalid Write, Zone Append
dd if=/dev/urandom of=/tmp/blk bs=4096 count=1 2>/dev/null
expect_sc 1bc write "$dev" --start-block=1029 --block-count=0 --data-size=4096 --data=/tmp/blk
expect_ok zns zone-append "$dev" --zslba=1024 --data-size=4096 --data=/tmp/blk
echo "$OUT" | grep -qE 'LBA (0x)?(1024|400)$' || fail "first append not at the zone start: $OUT"
expect_ok zns zone-append "$dev" --zslba=1024 --data-size=4096 --data=/tmp/blk
echo "$OUT" | grep -qE 'LBA (0x)?(1025|401)$' || fail "second append not one block after the first: $OUT"
expect_sc 1bc write "$dev" --start-block=1024 --block-count=0 --data-size=4096 --data=/tmp/blk

# open and active limits
for z in 10 11 12 13; do expect_ok zns open-zone "$dev" --start-lba=$((z * 512)); done
expect_sc 1be zns open-zone "$dev" --start-lba=$((14 * 512))
for z in 10 11 12 13; do expect_ok zns close-zone "$dev" --start-lba=$((z * 512)); done
# zone 2 (appended to) is active too: 4 closed + zone 2 + zone 14 = 6
expect_ok zns open-zone "$dev" --start-lba=$((14 * 512))
expect_sc 1bd zns open-zone "$dev" --start-lba=$((15 * 512))
expect_ok zns reset-zone "$dev" --select-all
n=$(blkzone report "$dev" | grep -c '(em)'); [ "$n" = 64 ] || fail "after reset-zone --select-all: $n of 64 zones empty"

# fio over many zones, fewer open at a time than there are zones
fio --name=zbd --filename="$dev" --direct=1 --ioengine=io_uring --iodepth=8 --zonemode=zbd --rw=randwrite \
  --bs=4k --size=64M --max_open_zones=4 --verify=crc32c --do_verify=1 --verify_fatal=1 \
  --output-format=terse --terse-version=3 > /tmp/fio.out 2>&1
frc=$?
# terse v3: 5 errors, 6 KiB read (the verify pass), 47 KiB written, 49 write IOPS
log "fio zbd randwrite verify: exit $frc: $(awk -F';' '/^3;/ {print "errors " $5 ", written KiB " $47 ", verified (read) KiB " $6 ", write IOPS " $49}' /tmp/fio.out)"
verified=$(awk -F';' '/^3;/ {print $6}' /tmp/fio.out)
[ "${verified:-0}" -ge 65536 ] || fail "fio verified only '${verified}' KiB of the 64 MiB written"
[ $frc = 0 ] || fail "fio --zonemode=zbd randwrite with verify failed: $(tail -5 /tmp/fio.out | tr '\n' ' ')"
written=$(blkzone report "$dev" | grep -vc '(em)')
log "zones written by fio: $written of 64"
[ "$written" -ge 16 ] || fail "fio wrote only $written zones"
blkzone reset "$dev" || fail "blkzone reset (all zones)"
n=$(blkzone report "$dev" | grep -c '(em)'); [ "$n" = 64 ] || fail "after blkzone reset: $n of 64 zones empty"

# zone descriptor extensions (zone-ext=64: ZDES 1): the 64 bytes after zone 30's descriptor
expect_ok zns id-ns "$dev"
echo "$OUT" | grep -q 'zdes:1' || fail "zns id-ns has no LBA format extension with zdes 1"
head -c 64 /dev/urandom > /tmp/ext
z30=$((30 * 512))
expect_ok zns set-zone-desc "$dev" --start-lba=$z30 --data=/tmp/ext
line=$(zone_line 30); log "after set-zone-desc: $line"
echo "$line" | grep -q '(cl)' || fail "zone 30 not closed after set-zone-desc: $line"
expect_sc 1bf zns set-zone-desc "$dev" --start-lba=$z30 --data=/tmp/ext
expect_ok zns report-zones "$dev" --extended -s $z30 -d 1
zone_report $z30 1; cp /tmp/zr /tmp/xr
log "extended report: $(wc -c < /tmp/xr) bytes, zone 30 attrs $(bytes 1 66 < /tmp/xr), extension $(bytes 8 128 < /tmp/xr) ..."
[ "$(bytes 1 66 < /tmp/xr)" = 80 ] || fail "zone 30's attributes are $(bytes 1 66 < /tmp/xr), expected 80 (ZDEV)"
[ "$(bytes 64 128 < /tmp/xr)" = "$(bytes 64 < /tmp/ext)" ] || fail "the extended report's extension is not what set-zone-desc sent"
expect_ok zns reset-zone "$dev" --start-lba=$z30
zone_report $z30 1; cp /tmp/zr /tmp/xr
[ "$(bytes 1 66 < /tmp/xr)" = 00 ] && [ "$(bytes 64 128 < /tmp/xr | tr -d '0 ')" = "" ] \
  || fail "reset left zone 30 with attributes $(bytes 1 66 < /tmp/xr) or extension data"

# zones the controller fails by itself (the host side's vnvme ctl), as a worn device's would
aec=$(nvme get-feature /dev/nvme0 -f 0x0b 2>&1 | sed -n 's/.*Current value: *\(0x[0-9a-fA-F]*\).*/\1/p')
expect_ok set-feature /dev/nvme0 --feature-id=0x0b --value=$(( ${aec:-0} | (1 << 27) ))
expect_ok get-feature /dev/nvme0 --feature-id=0x0b
echo "$OUT" | grep -qi 'current value: *0x0*8000300' || fail "Asynchronous Event Configuration is not 8000300h: $OUT"
z40=$((40 * 512)) z41=$((41 * 512))
dd if=/dev/urandom of=/tmp/blk bs=4096 count=1 2>/dev/null
expect_ok write "$dev" --start-block=$z40 --block-count=0 --data-size=4096 --data=/tmp/blk
mark=$(dmesg | wc -l)
echo "ZNS-ASK 1"
i=0; until zone_line 40 | grep -q '(ro)'; do [ $i -ge 600 ] && break; sleep 0.1; i=$((i + 1)); done
line=$(zone_line 40); log "zone 40 after step 1: $line"
echo "$line" | grep -q '(ro)' || fail "zone 40 is not read only after zone_set_state: $line"
i=0; until dmesg | tail -n +$((mark + 1)) | grep -q 'async event result 00bfef02'; do [ $i -ge 50 ] && break; sleep 0.1; i=$((i + 1)); done
ev=$(dmesg | tail -n +$((mark + 1)) | grep -i 'async event' | head -2 | tr '\n' ' '); log "dmesg: $ev"
echo "$ev" | grep -q 'async event result 00bfef02' || fail "no Zone Descriptor Changed event (00bfef02) in dmesg: '$ev'"
expect_ok zns changed-zone-list "$dev" --rae
[ "$(changed_zones --rae)" = $z40 ] || fail "changed-zone-list --rae: '$(changed_zones --rae)', expected $z40"
[ "$(changed_zones)" = $z40 ] || fail "changed-zone-list does not list zone 40 ($z40)"
[ "$(changed_zones)" = "" ] || fail "changed-zone-list not emptied by reading it: '$(changed_zones)'"
expect_sc 1ba write "$dev" --start-block=$((z40 + 1)) --block-count=0 --data-size=4096 --data=/tmp/blk
expect_ok read "$dev" --start-block=$z40 --block-count=0 --data-size=4096 --data=/tmp/rd
cmp /tmp/blk /tmp/rd || fail "zone 40 (read only) does not read back what was written"

echo "ZNS-ASK 2"
i=0; until zone_line 41 | grep -q '(of)'; do [ $i -ge 600 ] && break; sleep 0.1; i=$((i + 1)); done
line=$(zone_line 41); log "zone 41 after step 2: $line"
echo "$line" | grep -q '(of)' || fail "zone 41 is not offline after zone_set_state: $line"
zone_report $z41
[ "$(bytes 1 65 < /tmp/zr)" = f0 ] || fail "report-zones: zone 41's state byte is $(bytes 1 65 < /tmp/zr), expected f0 (offline)"
expect_ok zns report-zones "$dev" -s $z41 -d 1
expect_sc 1bb write "$dev" --start-block=$z41 --block-count=0 --data-size=4096 --data=/tmp/blk
expect_sc 1bb read "$dev" --start-block=$z41 --block-count=0 --data-size=4096 --data=/tmp/rd
expect_ok zns changed-zone-list "$dev" --rae
[ "$(changed_zones)" = $z41 ] || fail "changed-zone-list does not list zone 41 ($z41)"

z42=$((42 * 512))
expect_ok write "$dev" --start-block=$z42 --block-count=0 --data-size=4096 --data=/tmp/blk
echo "ZNS-ASK 3"
i=0; until zone_line 42 | grep -q '(fu)'; do [ $i -ge 600 ] && break; sleep 0.1; i=$((i + 1)); done
line=$(zone_line 42); log "zone 42 after step 3: $line"
echo "$line" | grep -q '(fu)' || fail "zone 42 is not full after zone_set_state state=full: $line"
zone_report $z42
[ "$(bytes 2 65 < /tmp/zr)" = "e0 01" ] || fail "report-zones: zone 42's state and attributes are $(bytes 2 65 < /tmp/zr), expected e0 01 (full, ZFC)"
expect_sc 1b9 write "$dev" --start-block=$((z42 + 1)) --block-count=0 --data-size=4096 --data=/tmp/blk
[ "$(changed_zones)" = $z42 ] || fail "changed-zone-list does not list zone 42 ($z42)"

check_no_nvme_errors || fail "nvme errors in dmesg"
[ $rc = 0 ] && log "PASS"
exit $rc
