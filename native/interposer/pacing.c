/* SM-share limiter. Placeholder until the limiter lands: admits every launch. */
#include "internal.h"

void vgpu_launch_admit(uint64_t cost)
{
    (void)cost;
}
