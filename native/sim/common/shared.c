/*
 * The state file every process of a simulated machine maps, and the protocols on it.
 *
 * File: a header page, then per device a page-aligned struct sim_shared_device followed by its
 * interval ring (engine.c). The file is created and initialised once, under flock (a lock the
 * kernel drops when its holder dies, and which is held only while opening). After that nothing
 * in the file is ever locked:
 *
 * Slots. A process claims a free slot with one CAS of `owner` from 0 to its identity (start
 * time and pid, so a reused pid is not mistaken for the old owner), then bumps the slot's
 * generation. Anyone may repair the slot of a dead owner: read the owner, read `memory`, check
 * the owner again (a dead identity never comes back, so `memory` was the dead owner's), CAS the
 * bytes to zero within the same generation, then CAS the owner to 0. Every step is idempotent
 * and guarded, so reapers racing each other, a reaper killed halfway, or a new owner arriving
 * meanwhile all end in a consistent slot.
 *
 * Memory. The bytes a device holds are the sum over its slots: there is no separate counter to
 * fall out of step when a process dies between two updates. A charge adds to its own slot
 * first, then sums all slots; if the sum exceeds the capacity it takes its bytes back. Of two
 * processes charging at once, the later adder always sees the earlier one (sequentially
 * consistent atomics), so together they never exceed the capacity. A charge that failed only
 * because of others in flight sees the room once they settle, and tries again.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim.h"
#include "vgpu/proc.h"

#define SIM_STATE_MAGIC 0x31304d5355504756ull /* "VGPUSM01" */
#define SIM_LAYOUT_VERSION 2u                 /* 2: the checkpoint records */
#define SIM_PAGE 4096u
#define SIM_RING_MIN_RECORDS 8192ull
#define SIM_RING_MAX_RECORDS (1ull << 21)
#define SIM_PID_BITS 22 /* Linux pids stay below PID_MAX_LIMIT = 2^22 */

struct sim_state_header {
    _Atomic uint64_t magic; /* stored last: the file is initialised */
    uint32_t layout_version;
    uint32_t device_count;
    uint64_t spec_hash;
    uint64_t total_size;
    uint64_t device_offset[SIM_MAX_DEVICES];
    uint64_t ring_offset[SIM_MAX_DEVICES];
    uint64_t ring_records[SIM_MAX_DEVICES];
    uint64_t checkpoint_offset;
};

static size_t round_up(size_t value, size_t unit)
{
    return (value + unit - 1) / unit * unit;
}

/* The ring must reach back over a few sample periods. A record is at least one kernel and a
 * kernel lasts at least block_ns, and kernels never overlap on a device, so this many records
 * always span three periods, however many processes share the device. */
static uint64_t ring_records_for(const struct sim_device_spec *device)
{
    uint64_t wanted = 3 * SIM_SAMPLE_PERIOD_NS / device->block_ns + 1;
    uint64_t records = SIM_RING_MIN_RECORDS;
    while (records < wanted && records < SIM_RING_MAX_RECORDS)
        records <<= 1;
    return records;
}

static void compute_layout(const struct sim_spec *spec, struct sim_state_header *header)
{
    memset(header, 0, sizeof *header);
    header->layout_version = SIM_LAYOUT_VERSION;
    header->device_count = (uint32_t)spec->count;
    header->spec_hash = sim_spec_hash(spec);
    size_t offset = round_up(sizeof(struct sim_state_header), SIM_PAGE);
    for (int i = 0; i < spec->count; i++) {
        header->device_offset[i] = offset;
        offset += round_up(sizeof(struct sim_shared_device), SIM_PAGE);
        header->ring_offset[i] = offset;
        header->ring_records[i] = ring_records_for(&spec->devices[i]);
        offset += round_up(header->ring_records[i] * sizeof(struct sim_interval), SIM_PAGE);
    }
    header->checkpoint_offset = offset;
    offset += round_up(SIM_CHECKPOINT_RECORDS * sizeof(struct sim_checkpoint_record), SIM_PAGE);
    header->total_size = offset;
}

uint64_t sim_identity(pid_t pid)
{
    return vgpu_proc_start_time_at(sim_proc_root(), pid) << SIM_PID_BITS | (uint64_t)pid;
}

pid_t sim_driver_pid(void)
{
    char path[4096], link[32];
    snprintf(path, sizeof path, "%s/self", sim_proc_root());
    ssize_t length = readlink(path, link, sizeof link - 1);
    if (length <= 0)
        return getpid();
    link[length] = '\0';
    char *end;
    long pid = strtol(link, &end, 10);
    return *end == '\0' && pid > 0 ? (pid_t)pid : getpid();
}

pid_t sim_identity_pid(uint64_t identity)
{
    return (pid_t)(identity & ((1ull << SIM_PID_BITS) - 1));
}

static int identity_alive(uint64_t identity)
{
    return vgpu_proc_alive_at(sim_proc_root(), sim_identity_pid(identity), identity >> SIM_PID_BITS);
}

int sim_identity_alive(uint64_t identity)
{
    return identity_alive(identity);
}

/* Whether a state file laid out by `header` (an older spec) still has a live process in it. */
static int state_in_use(int fd, const struct sim_state_header *header, size_t file_size)
{
    if (header->layout_version != SIM_LAYOUT_VERSION || header->device_count > SIM_MAX_DEVICES)
        return 0; /* a layout this code cannot read: nothing of ours can be using it */
    void *old = mmap(NULL, file_size, PROT_READ, MAP_SHARED, fd, 0);
    if (old == MAP_FAILED)
        return 0;
    int in_use = 0;
    for (uint32_t d = 0; d < header->device_count && !in_use; d++) {
        if (header->device_offset[d] + sizeof(struct sim_shared_device) > file_size)
            break;
        const struct sim_shared_device *device = (const void *)((char *)old + header->device_offset[d]);
        for (int s = 0; s < SIM_MAX_PROCS && !in_use; s++) {
            uint64_t owner = atomic_load(&device->slots[s].owner);
            in_use = owner != 0 && identity_alive(owner);
        }
    }
    munmap(old, file_size);
    return in_use;
}

static int open_state_file(const char *path, int is_default, const char *library)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | (is_default ? O_NOFOLLOW : 0), 0666);
    if (fd < 0) {
        fprintf(stderr,
                "%s: cannot open the simulated GPU's state file %s: %s (set VGPU_SIM_STATE to a writable path)\n",
                library, path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (is_default && (fstat(fd, &st) != 0 || st.st_uid != getuid())) {
        fprintf(stderr, "%s: the simulated GPU's state file %s belongs to another user; set VGPU_SIM_STATE\n", library,
                path);
        close(fd);
        return -1;
    }
    return fd;
}

int sim_machine_open(struct sim_machine *machine, const struct sim_env *env, const char *library)
{
    memset(machine, 0, sizeof *machine);
    char error[512];
    if (sim_spec_parse(env->devices, &machine->spec, error, sizeof error) != 0) {
        fprintf(stderr, "%s: VGPU_SIM_DEVICES is malformed, so the simulated GPU has no device: %s\n", library, error);
        return -1;
    }
    int driver_version;
    if (sim_driver_version_parse(env->driver_version, &driver_version, error, sizeof error) != 0) {
        fprintf(stderr, "%s: the simulated GPU has no device: %s\n", library, error);
        return -1;
    }
    struct sim_state_header want;
    compute_layout(&machine->spec, &want);

    char path[4096];
    if (env->state_path)
        snprintf(path, sizeof path, "%s", env->state_path);
    else if (env->runtime_dir)
        snprintf(path, sizeof path, "%s/jupyter-vgpu-sim-v%u-%016llx.state", env->runtime_dir, SIM_LAYOUT_VERSION,
                 (unsigned long long)want.spec_hash);
    else
        snprintf(path, sizeof path, "/tmp/jupyter-vgpu-sim-%u-v%u-%016llx.state", (unsigned)getuid(),
                 SIM_LAYOUT_VERSION, (unsigned long long)want.spec_hash);
    int fd = open_state_file(path, env->state_path == NULL, library);
    if (fd < 0)
        return -1;

    int result = -1;
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            fprintf(stderr, "%s: cannot lock %s: %s\n", library, path, strerror(errno));
            close(fd);
            return -1;
        }
    }
    struct stat st;
    struct sim_state_header found;
    memset(&found, 0, sizeof found);
    if (fstat(fd, &st) != 0)
        goto out;
    size_t file_size = (size_t)st.st_size;
    if (file_size >= sizeof found && pread(fd, &found, sizeof found, 0) != (ssize_t)sizeof found)
        goto out;
    int ready = atomic_load(&found.magic) == SIM_STATE_MAGIC && found.layout_version == want.layout_version &&
                found.spec_hash == want.spec_hash && found.total_size == want.total_size &&
                file_size >= want.total_size;
    if (!ready) {
        if (atomic_load(&found.magic) == SIM_STATE_MAGIC && state_in_use(fd, &found, file_size)) {
            fprintf(stderr,
                    "%s: the simulated GPU's state file %s is in use by running processes with another "
                    "VGPU_SIM_DEVICES; give this machine its own VGPU_SIM_STATE\n",
                    library, path);
            goto out;
        }
        /* Stale or foreign state nobody uses: start over from zeros (a valid empty machine). */
        if (ftruncate(fd, 0) != 0 || ftruncate(fd, (off_t)want.total_size) != 0) {
            fprintf(stderr, "%s: cannot size %s: %s\n", library, path, strerror(errno));
            goto out;
        }
    }
    void *mapping = mmap(NULL, want.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapping == MAP_FAILED) {
        fprintf(stderr, "%s: cannot map %s: %s\n", library, path, strerror(errno));
        goto out;
    }
    struct sim_state_header *header = mapping;
    if (!ready) {
        uint64_t magic = SIM_STATE_MAGIC;
        want.magic = 0;
        memcpy(header, &want, sizeof want);
        atomic_store(&header->magic, magic);
    }
    machine->mapping = mapping;
    machine->mapping_size = want.total_size;
    machine->checkpoint_records = (struct sim_checkpoint_record *)((char *)mapping + want.checkpoint_offset);
    for (int i = 0; i < machine->spec.count; i++) {
        struct sim_device_view *view = &machine->devices[i];
        view->index = i;
        view->spec = &machine->spec.devices[i];
        view->shared = (struct sim_shared_device *)((char *)mapping + want.device_offset[i]);
        view->ring = (struct sim_interval *)((char *)mapping + want.ring_offset[i]);
        view->ring_mask = want.ring_records[i] - 1;
    }
    result = 0;
out:
    if (result != 0 && !machine->mapping)
        memset(machine, 0, sizeof *machine);
    flock(fd, LOCK_UN);
    close(fd);
    return result;
}

void sim_machine_close(struct sim_machine *machine)
{
    if (machine->mapping)
        munmap(machine->mapping, machine->mapping_size);
    memset(machine, 0, sizeof *machine);
}

/* A new tenure of a slot: a fresh generation, nothing held. */
static void begin_tenure(struct sim_slot *slot)
{
    uint64_t memory = atomic_load(&slot->memory);
    atomic_store(&slot->contexts, 0);
    atomic_store(&slot->memory, (uint64_t)((SIM_SLOT_GENERATION(memory) + 1) & 0xffff) << 48);
}

int sim_slot_claim(struct sim_device_view *device, uint64_t identity)
{
    struct sim_shared_device *shared = device->shared;
    uint32_t used = atomic_load(&shared->slots_used);
    /* Our own identity already in a slot: this process exec'ed; what that image held is gone. */
    for (uint32_t i = 0; i < used && i < SIM_MAX_PROCS; i++) {
        if (atomic_load(&shared->slots[i].owner) == identity) {
            begin_tenure(&shared->slots[i]);
            return (int)i;
        }
    }
    for (int round = 0; round < 2; round++) {
        for (uint32_t i = 0; i < SIM_MAX_PROCS; i++) {
            uint64_t expected = 0;
            if (atomic_load(&shared->slots[i].owner) != 0 ||
                !atomic_compare_exchange_strong(&shared->slots[i].owner, &expected, identity))
                continue;
            begin_tenure(&shared->slots[i]);
            uint32_t high = atomic_load(&shared->slots_used);
            while (high < i + 1 && !atomic_compare_exchange_weak(&shared->slots_used, &high, i + 1)) {
            }
            return (int)i;
        }
        if (sim_reap_dead(device) == 0)
            break;
    }
    return -1;
}

void sim_slot_release(struct sim_device_view *device, int slot, uint64_t identity)
{
    struct sim_slot *s = &device->shared->slots[slot];
    if (atomic_load(&s->owner) != identity)
        return;
    uint64_t memory = atomic_load(&s->memory);
    atomic_store(&s->memory, memory & ~SIM_SLOT_BYTES_MASK);
    atomic_store(&s->contexts, 0);
    atomic_compare_exchange_strong(&s->owner, &identity, 0);
}

int sim_reap_dead(struct sim_device_view *device)
{
    struct sim_shared_device *shared = device->shared;
    uint32_t used = atomic_load(&shared->slots_used);
    int reaped = 0;
    for (uint32_t i = 0; i < used && i < SIM_MAX_PROCS; i++) {
        struct sim_slot *slot = &shared->slots[i];
        uint64_t owner = atomic_load(&slot->owner);
        if (owner == 0 || identity_alive(owner))
            continue;
        uint64_t memory = atomic_load(&slot->memory);
        if (atomic_load(&slot->owner) != owner)
            continue; /* reaped and claimed again meanwhile: `memory` may be the new owner's */
        uint32_t generation = SIM_SLOT_GENERATION(memory);
        while ((memory & SIM_SLOT_BYTES_MASK) != 0 && SIM_SLOT_GENERATION(memory) == generation &&
               !atomic_compare_exchange_weak(&slot->memory, &memory, memory & ~SIM_SLOT_BYTES_MASK)) {
        }
        if (atomic_compare_exchange_strong(&slot->owner, &owner, 0))
            reaped++;
    }
    return reaped;
}

uint64_t sim_device_used(const struct sim_device_view *device)
{
    const struct sim_shared_device *shared = device->shared;
    uint32_t used = atomic_load(&shared->slots_used);
    uint64_t total = 0;
    /* A free slot holds nothing, even if a thread of its exiting owner charged it after the
     * owner let it go (the next claim clears it). */
    for (uint32_t i = 0; i < used && i < SIM_MAX_PROCS; i++)
        if (atomic_load(&shared->slots[i].owner) != 0)
            total += atomic_load(&shared->slots[i].memory) & SIM_SLOT_BYTES_MASK;
    return total;
}

int sim_memory_charge(struct sim_device_view *device, int slot, uint64_t bytes)
{
    uint64_t capacity = device->spec->memory;
    if (bytes > capacity)
        return -1;
    _Atomic uint64_t *mine = &device->shared->slots[slot].memory;
    int reaped = 0;
    for (int attempt = 0; attempt < 64; attempt++) {
        atomic_fetch_add(mine, bytes);
        if (sim_device_used(device) <= capacity)
            return 0;
        atomic_fetch_sub(mine, bytes);
        /* Over capacity: truly, or only because other charges in flight added their bytes
         * before checking (a failing one takes them back within nanoseconds). Only a shortfall
         * that persists over a few looks, a few hundred microseconds apart in all, is real; the
         * memory of dead processes is freed before the first look counts. */
        int room = 0;
        for (int look = 0; look < 5 && !room; look++) {
            if (!reaped++ && sim_reap_dead(device) > 0)
                room = 1;
            else if (sim_device_used(device) + bytes <= capacity)
                room = 1;
            else {
                struct timespec pause = {0, 20000L * (look + 1) + 1000L * ((getpid() + attempt) % 17)};
                nanosleep(&pause, NULL);
            }
        }
        if (!room)
            return -1;
    }
    return -1;
}

void sim_memory_uncharge(struct sim_device_view *device, int slot, uint64_t bytes)
{
    atomic_fetch_sub(&device->shared->slots[slot].memory, bytes);
}

uint32_t sim_slot_generation(const struct sim_device_view *device, int slot)
{
    return SIM_SLOT_GENERATION(atomic_load(&device->shared->slots[slot].memory));
}

void sim_slot_add_contexts(struct sim_device_view *device, int slot, int delta)
{
    atomic_fetch_add(&device->shared->slots[slot].contexts, (uint32_t)delta);
}

int sim_list_processes(struct sim_device_view *device, struct sim_process *out, int max)
{
    sim_reap_dead(device);
    struct sim_shared_device *shared = device->shared;
    uint32_t used = atomic_load(&shared->slots_used);
    int count = 0;
    for (uint32_t i = 0; i < used && i < SIM_MAX_PROCS && count < max; i++) {
        struct sim_slot *slot = &shared->slots[i];
        uint64_t owner = atomic_load(&slot->owner);
        if (owner == 0)
            continue;
        uint64_t bytes = atomic_load(&slot->memory) & SIM_SLOT_BYTES_MASK;
        uint32_t contexts = atomic_load(&slot->contexts);
        if (atomic_load(&slot->owner) != owner || (bytes == 0 && contexts == 0))
            continue;
        out[count++] = (struct sim_process){.pid = sim_identity_pid(owner), .slot = (int)i, .memory = bytes};
    }
    return count;
}
