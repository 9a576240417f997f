/*
 * VGPU_SIM_DEVICES and CUDA_VISIBLE_DEVICES: the one parser of each.
 *
 * VGPU_SIM_DEVICES lists devices separated by ';', each a ','-separated list of key=value:
 *   name            device name (default "jupyter-vgpu simulated GPU")
 *   uuid            GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (default GPU-5eed0000-0000-4000-8000-<index>)
 *   memory          capacity: a number with B, K/KiB, M/MiB, G/GiB, T/TiB; a bare number is MiB
 *   sms             streaming multiprocessors (1..1024)
 *   context_memory  driver memory each context holds on the device, same units as memory
 *   block_ns        nanoseconds one block of <= 256 threads occupies an SM
 * A malformed spec is refused as a whole: a simulator that quietly guessed would test nothing.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sim.h"

#define SPEC_TEXT_MAX 8192
#define SPEC_ACCEPTED                                                                                                  \
    "accepted: devices separated by ';', each 'key=value,...' with keys name, uuid, memory, sms, "                     \
    "context_memory, block_ns (sizes like 16GiB, 512MiB, 4G; a bare number is MiB)"

static int fail(char *error, size_t error_size, const char *format, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *error, size_t error_size, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    int used = vsnprintf(error, error_size, format, args);
    va_end(args);
    if (used >= 0 && (size_t)used < error_size)
        snprintf(error + used, error_size - (size_t)used, " (%s)", SPEC_ACCEPTED);
    return -1;
}

static char *trim(char *text)
{
    while (isspace((unsigned char)*text))
        text++;
    char *end = text + strlen(text);
    while (end > text && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return text;
}

/* Decimal digits only: strtoull alone would take "-1" or " 7". */
static int parse_count(const char *text, uint64_t *out)
{
    if (!isdigit((unsigned char)*text))
        return -1;
    errno = 0;
    char *end;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || *end)
        return -1;
    *out = value;
    return 0;
}

/* The size units of the project's contract (DESIGN.md): binary multiples, bare number = MiB. */
static int parse_size(const char *text, uint64_t *out)
{
    static const struct {
        const char *unit;
        unsigned shift;
    } units[] = {{"", 20},    {"b", 0},  {"k", 10},   {"kib", 10}, {"m", 20},
                 {"mib", 20}, {"g", 30}, {"gib", 30}, {"t", 40},   {"tib", 40}};
    if (!isdigit((unsigned char)*text))
        return -1;
    errno = 0;
    char *unit;
    unsigned long long value = strtoull(text, &unit, 10);
    if (errno)
        return -1;
    unit = trim(unit);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(unit, units[i].unit) == 0) {
            if (value > (UINT64_MAX >> units[i].shift))
                return -1;
            *out = (uint64_t)value << units[i].shift;
            return 0;
        }
    }
    return -1;
}

static int hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* "GPU-" then 8-4-4-4-12 hex digits, the form NVML and nvidia-smi print. */
static int parse_uuid(const char *text, char normalised[SIM_UUID_SIZE], unsigned char bytes[16])
{
    static const int group_lengths[] = {8, 4, 4, 4, 12};
    if (strncasecmp(text, "GPU-", 4) != 0)
        return -1;
    const char *p = text + 4;
    int nibble = 0;
    for (int group = 0; group < 5; group++) {
        if (group > 0 && *p++ != '-')
            return -1;
        for (int i = 0; i < group_lengths[group]; i++, p++) {
            int value = hex_value((unsigned char)*p);
            if (value < 0)
                return -1;
            if (nibble % 2 == 0)
                bytes[nibble / 2] = (unsigned char)(value << 4);
            else
                bytes[nibble / 2] |= (unsigned char)value;
            nibble++;
        }
    }
    if (*p)
        return -1;
    memcpy(normalised, "GPU-", 4);
    for (int i = 4; text[i]; i++)
        normalised[i] = (char)tolower((unsigned char)text[i]);
    normalised[strlen(text)] = '\0';
    return 0;
}

static void default_device(struct sim_device_spec *device, int index)
{
    memset(device, 0, sizeof *device);
    snprintf(device->name, sizeof device->name, "%s", SIM_DEFAULT_NAME);
    char uuid[SIM_UUID_SIZE];
    snprintf(uuid, sizeof uuid, "GPU-5eed0000-0000-4000-8000-%012d", index);
    parse_uuid(uuid, device->uuid, device->uuid_bytes);
    device->memory = SIM_DEFAULT_MEMORY;
    device->sms = SIM_DEFAULT_SMS;
    device->context_memory = SIM_DEFAULT_CONTEXT_MEMORY;
    device->block_ns = SIM_DEFAULT_BLOCK_NS;
}

enum spec_key { KEY_NAME, KEY_UUID, KEY_MEMORY, KEY_SMS, KEY_CONTEXT_MEMORY, KEY_BLOCK_NS, KEY_COUNT };
static const char *const key_names[KEY_COUNT] = {"name", "uuid", "memory", "sms", "context_memory", "block_ns"};

static int parse_item(struct sim_device_spec *device, int index, enum spec_key key, const char *value, char *error,
                      size_t error_size)
{
    uint64_t number;
    switch (key) {
    case KEY_NAME:
        if (!*value || strlen(value) >= SIM_NAME_SIZE)
            return fail(error, error_size, "device %d: name must be 1 to %d characters", index, SIM_NAME_SIZE - 1);
        snprintf(device->name, sizeof device->name, "%s", value);
        return 0;
    case KEY_UUID:
        if (strlen(value) >= SIM_UUID_SIZE || parse_uuid(value, device->uuid, device->uuid_bytes) != 0)
            return fail(error, error_size,
                        "device %d: uuid '%s' is not GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex digits)", index,
                        value);
        return 0;
    case KEY_MEMORY:
        if (parse_size(value, &number) != 0 || number < (1ull << 20) || number > SIM_MAX_MEMORY)
            return fail(error, error_size, "device %d: memory '%s' is not a size from 1MiB to 64TiB", index, value);
        device->memory = number;
        return 0;
    case KEY_SMS:
        if (parse_count(value, &number) != 0 || number < 1 || number > 1024)
            return fail(error, error_size, "device %d: sms '%s' is not a whole number from 1 to 1024", index, value);
        device->sms = (uint32_t)number;
        return 0;
    case KEY_CONTEXT_MEMORY:
        if (parse_size(value, &number) != 0 || number > SIM_MAX_MEMORY)
            return fail(error, error_size, "device %d: context_memory '%s' is not a size", index, value);
        device->context_memory = number;
        return 0;
    case KEY_BLOCK_NS:
        if (parse_count(value, &number) != 0 || number < 1 || number > 10000000000ull)
            return fail(error, error_size, "device %d: block_ns '%s' is not a whole number from 1 to 10^10", index,
                        value);
        device->block_ns = number;
        return 0;
    case KEY_COUNT: break;
    }
    return -1;
}

static int parse_device(char *text, struct sim_device_spec *device, int index, char *error, size_t error_size)
{
    int seen[KEY_COUNT] = {0};
    default_device(device, index);
    char *save = NULL;
    for (char *item = strtok_r(text, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        item = trim(item);
        if (!*item)
            continue;
        char *equals = strchr(item, '=');
        if (!equals)
            return fail(error, error_size, "device %d: '%s' is not key=value", index, item);
        *equals = '\0';
        char *key_text = trim(item), *value = trim(equals + 1);
        int key = 0;
        while (key < KEY_COUNT && strcmp(key_text, key_names[key]) != 0)
            key++;
        if (key == KEY_COUNT)
            return fail(error, error_size, "device %d: unknown key '%s'", index, key_text);
        if (seen[key]++)
            return fail(error, error_size, "device %d: key '%s' given twice", index, key_text);
        if (parse_item(device, index, (enum spec_key)key, value, error, error_size) != 0)
            return -1;
    }
    if (device->context_memory >= device->memory)
        return fail(error, error_size, "device %d: context_memory must be smaller than memory", index);
    return 0;
}

int sim_spec_parse(const char *text, struct sim_spec *spec, char *error, size_t error_size)
{
    memset(spec, 0, sizeof *spec);
    if (!text || !*text) {
        default_device(&spec->devices[0], 0);
        spec->count = 1;
        return 0;
    }
    if (strlen(text) >= SPEC_TEXT_MAX)
        return fail(error, error_size, "longer than %d characters", SPEC_TEXT_MAX - 1);
    char copy[SPEC_TEXT_MAX];
    snprintf(copy, sizeof copy, "%s", text);
    char *save = NULL;
    for (char *device = strtok_r(copy, ";", &save); device; device = strtok_r(NULL, ";", &save)) {
        if (!*trim(device))
            continue;
        if (spec->count == SIM_MAX_DEVICES)
            return fail(error, error_size, "more than %d devices", SIM_MAX_DEVICES);
        if (parse_device(device, &spec->devices[spec->count], spec->count, error, error_size) != 0)
            return -1;
        spec->count++;
    }
    if (spec->count == 0)
        return fail(error, error_size, "no device given");
    for (int i = 0; i < spec->count; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(spec->devices[i].uuid, spec->devices[j].uuid) == 0)
                return fail(error, error_size, "devices %d and %d have the same uuid %s", j, i, spec->devices[i].uuid);
    return 0;
}

static uint64_t fnv1a(uint64_t hash, const void *data, size_t size)
{
    const unsigned char *bytes = data;
    for (size_t i = 0; i < size; i++) {
        hash ^= bytes[i];
        hash *= 0x100000001b3ull;
    }
    return hash;
}

uint64_t sim_spec_hash(const struct sim_spec *spec)
{
    uint64_t hash = 0xcbf29ce484222325ull;
    hash = fnv1a(hash, &spec->count, sizeof spec->count);
    for (int i = 0; i < spec->count; i++) {
        const struct sim_device_spec *d = &spec->devices[i];
        hash = fnv1a(hash, d->name, strlen(d->name) + 1);
        hash = fnv1a(hash, d->uuid_bytes, sizeof d->uuid_bytes);
        hash = fnv1a(hash, &d->memory, sizeof d->memory);
        hash = fnv1a(hash, &d->context_memory, sizeof d->context_memory);
        hash = fnv1a(hash, &d->sms, sizeof d->sms);
        hash = fnv1a(hash, &d->block_ns, sizeof d->block_ns);
    }
    return hash;
}

/* The device an entry of CUDA_VISIBLE_DEVICES names, or -1. */
static int visible_entry(const char *entry, const struct sim_spec *spec)
{
    uint64_t index;
    if (parse_count(entry, &index) == 0)
        return index < (uint64_t)spec->count ? (int)index : -1;
    if (strncasecmp(entry, "GPU-", 4) != 0)
        return -1;
    int match = -1;
    for (int i = 0; i < spec->count; i++) {
        if (strncasecmp(spec->devices[i].uuid, entry, strlen(entry)) == 0) {
            if (match >= 0)
                return -1; /* an ambiguous prefix names no device */
            match = i;
        }
    }
    return match;
}

int sim_visible_devices(const char *text, const struct sim_spec *spec, int order[SIM_MAX_DEVICES])
{
    if (!text) {
        for (int i = 0; i < spec->count; i++)
            order[i] = i;
        return spec->count;
    }
    char copy[SPEC_TEXT_MAX];
    snprintf(copy, sizeof copy, "%s", text);
    int count = 0;
    char *entry = copy;
    while (entry && count < spec->count) {
        char *comma = strchr(entry, ',');
        if (comma)
            *comma = '\0';
        int device = visible_entry(trim(entry), spec);
        if (device < 0)
            break;
        for (int i = 0; i < count; i++)
            if (order[i] == device)
                return count; /* a repeated device ends the list, as an invalid one does */
        order[count++] = device;
        entry = comma ? comma + 1 : NULL;
    }
    return count;
}
