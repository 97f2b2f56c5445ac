/* nvme-sync-read.c - synchronous NVMe passthrough reads from inside the guest: one
 * NVME_IOCTL_IO64_CMD at a time, the "Sync-PT" column of the async passthrough seed's table
 * (`vnvme bench passthru --guest`, `run-vnvme-tests.sh passthru-table`).
 *
 * Built static on the host, so it runs in the rig's initramfs whatever libc the host has:
 *     cc -static -O2 -Wall -o nvme-sync-read nvme-sync-read.c
 * and put into the guest with `run-test.sh --guest-file PATH` (it lands at /nvme-sync-read).
 *
 * usage: nvme-sync-read [-n NAME] [-t SECS] [-r RAMP] DEV
 *          4 KiB random reads (Read, opcode 02h) over the whole namespace, one at a time, for SECS
 *          (default 5) after RAMP (default 1) unmeasured seconds; prints one line
 *          RESULT {"name":NAME,"iops":..,"ios":..,"io_kib":..,"lat_mean_us":..,"clat_p50_us":..,
 *                  "clat_p99_us":..,"runtime_ms":..,"err":0}
 *          (the field names of guest-lib.sh's fio_json)
 *        nvme-sync-read -c FILE [-s BLOCK] DEV
 *          reads FILE's size (whole 4 KiB blocks) from 4 KiB unit BLOCK (default 0) on, one
 *          command per block, and compares it with FILE
 *   DEV: the namespace's generic char device /dev/ngXnY (or its block device /dev/nvmeXnY).
 * Exit: 0 success; 1 a command failed (errno or NVMe status, printed), the data differs, or the
 * namespace cannot be read this way (metadata, blocks over 4 KiB); 2 usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/nvme_ioctl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define IO_SIZE 4096u

static const char *dev = "-";
static int fd;
static uint32_t nsid;
static unsigned lba_shift;
static uint64_t units; /* whole 4 KiB units in the namespace */

static void die(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "nvme-sync-read: %s: ", dev);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

/* A failed command: the kernel returns -1 and errno, or the NVMe status field (SC bits 7:0,
 * SCT 10:8, DNR bit 14) as a positive value. */
static void check(int r, const char *what, uint64_t unit)
{
	if (r < 0)
		die("%s at 4 KiB unit %llu failed: %s", what, (unsigned long long)unit, strerror(errno));
	if (r > 0)
		die("%s at 4 KiB unit %llu failed: NVMe status 0x%x (SCT %u, SC 0x%02x%s)", what,
		    (unsigned long long)unit, r, (r >> 8) & 7, r & 0xff, r & 0x4000 ? ", DNR" : "");
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Identify Namespace (CNS 00h): NSZE, and the data and metadata sizes of the LBA format in use. */
static void identify(void *buf)
{
	struct nvme_passthru_cmd64 cmd = {
		.opcode = 0x06,
		.nsid = nsid,
		.addr = (uintptr_t)buf,
		.data_len = 4096,
	};
	const uint8_t *id = buf;
	uint64_t nsze;
	unsigned flbas, index, ms;

	check(ioctl(fd, NVME_IOCTL_ADMIN64_CMD, &cmd), "Identify Namespace", 0);
	memcpy(&nsze, id, 8); /* little endian, as the guest */
	flbas = id[26];
	index = (flbas & 0xf) | ((flbas >> 5) & 3) << 4;
	ms = id[128 + 4 * index] | id[129 + 4 * index] << 8;
	lba_shift = id[130 + 4 * index];
	if (ms != 0)
		die("the LBA format in use has %u metadata bytes per block: not supported", ms);
	if (lba_shift < 9 || lba_shift > 12)
		die("LBA data size 2^%u: 512 to 4096 bytes supported", lba_shift);
	units = nsze >> (12 - lba_shift);
	if (units == 0)
		die("the namespace (%llu blocks) is smaller than 4 KiB", (unsigned long long)nsze);
}

/* One 4 KiB Read of 4 KiB unit `unit`; returns the kernel's answer. */
static int read_4k(void *buf, uint64_t unit)
{
	uint64_t slba = unit << (12 - lba_shift);
	struct nvme_passthru_cmd64 cmd = {
		.opcode = 0x02,
		.nsid = nsid,
		.addr = (uintptr_t)buf,
		.data_len = IO_SIZE,
		.cdw10 = (uint32_t)slba,
		.cdw11 = (uint32_t)(slba >> 32),
		.cdw12 = (IO_SIZE >> lba_shift) - 1, /* NLB, 0's based */
	};
	return ioctl(fd, NVME_IOCTL_IO64_CMD, &cmd);
}

/* xorshift64*: cheap, spreads the reads over the namespace */
static uint64_t next_unit(uint64_t *rng)
{
	*rng ^= *rng >> 12;
	*rng ^= *rng << 25;
	*rng ^= *rng >> 27;
	return (*rng * 0x2545f4914f6cdd1dull) % units;
}

static int by_value(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

static int timed(void *buf, const char *name, double secs, double ramp)
{
	uint64_t rng = 0x9e3779b97f4a7c15ull, ios = 0, cap = 1 << 16, unit;
	uint32_t *lat_ns = malloc(cap * sizeof *lat_ns);
	double start, end, t0, t1, elapsed, sum = 0;

	if (!lat_ns)
		die("out of memory");
	/* like fio's ramp_time: the first reads are not counted */
	for (end = now_s() + ramp; now_s() < end;) {
		unit = next_unit(&rng);
		check(read_4k(buf, unit), "Read", unit);
	}
	start = now_s();
	end = start + secs;
	for (t0 = start; t0 < end; t0 = t1) {
		unit = next_unit(&rng);
		check(read_4k(buf, unit), "Read", unit);
		t1 = now_s();
		if (ios == cap) {
			cap *= 2;
			lat_ns = realloc(lat_ns, cap * sizeof *lat_ns);
			if (!lat_ns)
				die("out of memory");
		}
		lat_ns[ios++] = (uint32_t)((t1 - t0) * 1e9);
		sum += t1 - t0;
	}
	elapsed = t0 - start;
	if (ios == 0)
		die("no read completed in %g s", secs);
	qsort(lat_ns, ios, sizeof *lat_ns, by_value);
	printf("RESULT {\"name\":\"%s\",\"iops\":%.0f,\"ios\":%llu,\"io_kib\":%llu,\"lat_mean_us\":%.1f,"
	       "\"clat_p50_us\":%u,\"clat_p99_us\":%u,\"runtime_ms\":%.0f,\"err\":0}\n",
	       name, ios / elapsed, (unsigned long long)ios, (unsigned long long)ios * (IO_SIZE / 1024),
	       sum / ios * 1e6, lat_ns[(ios - 1) / 2] / 1000, lat_ns[(ios - 1) * 99 / 100] / 1000,
	       elapsed * 1e3);
	free(lat_ns);
	return 0;
}

static int compare(void *buf, const char *file, uint64_t first)
{
	FILE *f = fopen(file, "rb");
	uint8_t want[IO_SIZE];
	const uint8_t *got = buf;
	uint64_t unit = first;
	size_t n;

	if (!f)
		die("cannot open %s: %s", file, strerror(errno));
	while ((n = fread(want, 1, IO_SIZE, f)) > 0) {
		if (n != IO_SIZE)
			die("%s is not a whole number of 4 KiB blocks (%zu bytes left over)", file, n);
		if (unit >= units)
			die("%s runs past the namespace's end (4 KiB unit %llu)", file, (unsigned long long)unit);
		check(read_4k(buf, unit), "Read", unit);
		for (size_t i = 0; i < IO_SIZE; i++)
			if (got[i] != want[i])
				die("4 KiB unit %llu differs from %s at byte %llu: read 0x%02x, expected 0x%02x",
				    (unsigned long long)unit, file,
				    (unsigned long long)((unit - first) * IO_SIZE + i), got[i], want[i]);
		unit++;
	}
	fclose(f);
	if (unit == first)
		die("%s is empty", file);
	printf("nvme-sync-read: %llu blocks of 4 KiB from unit %llu match %s\n",
	       (unsigned long long)(unit - first), (unsigned long long)first, file);
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: nvme-sync-read [-n NAME] [-t SECS] [-r RAMP] DEV\n"
			"       nvme-sync-read -c FILE [-s BLOCK] DEV\n");
	exit(2);
}

static double number(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	if (*s == 0 || *end != 0 || !(v >= 0 && v <= 1e12))
		usage();
	return v;
}

int main(int argc, char **argv)
{
	const char *name = "sync", *file = NULL;
	double secs = 5, ramp = 1;
	uint64_t first = 0;
	void *buf;
	int c, r;

	while ((c = getopt(argc, argv, "n:t:r:c:s:")) != -1) {
		switch (c) {
		case 'n': name = optarg; break;
		case 't': secs = number(optarg); break;
		case 'r': ramp = number(optarg); break;
		case 'c': file = optarg; break;
		case 's': first = (uint64_t)number(optarg); break;
		default: usage();
		}
	}
	/* the name goes into a JSON string unescaped */
	if (optind != argc - 1 || secs <= 0 || strpbrk(name, "\"\\"))
		usage();
	dev = argv[optind];
	fd = open(dev, O_RDONLY);
	if (fd < 0)
		die("cannot open: %s", strerror(errno));
	r = ioctl(fd, NVME_IOCTL_ID);
	if (r <= 0)
		die("NVME_IOCTL_ID failed (%s): not an NVMe namespace?", r < 0 ? strerror(errno) : "nsid 0");
	nsid = r;
	if (posix_memalign(&buf, 4096, 4096))
		die("out of memory");
	identify(buf);
	return file ? compare(buf, file, first) : timed(buf, name, secs, ramp);
}
