/**
 * The slice vocabulary in the browser: sizes, SM shares and policies, read and written exactly as
 * jupyter_vgpu/model/sizes.py does, so the sidebar and the dialog refuse bad input before it
 * reaches the server, with the server's own wording. The server validates again; this only saves a round trip.
 */

export const MIB = 2 ** 20;
export const GIB = 2 ** 30;

export const SIZE_HELP = 'a size like 512MiB, 4GiB, 4G or a bare number of MiB';
export const SM_SHARE_HELP = 'a whole percentage from 1 to 100';
export const POLICIES = ['hard', 'burst'] as const;
export type Policy = (typeof POLICIES)[number];
export const POLICY_HELP =
  "'hard' (never above the share) or 'burst' (may use idle capacity)";

// A bare number is MiB, HAMi's unit for nvidia.com/gpumem; G and GB mean GiB, as in sizes.py.
const UNITS: Record<string, number> = {
  '': MIB,
  b: 1,
  k: 2 ** 10,
  kb: 2 ** 10,
  kib: 2 ** 10,
  m: MIB,
  mb: MIB,
  mib: MIB,
  g: GIB,
  gb: GIB,
  gib: GIB,
  t: 2 ** 40,
  tb: 2 ** 40,
  tib: 2 ** 40
};
const SIZE = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i;

/** A value the user typed that is not accepted; the message says what is. */
export class SliceValueError extends Error {}

/** Bytes from a size: `512MiB`, `4GiB`, `4G`, `1.5GiB` or a bare number of MiB. */
export function parseSize(text: string): number {
  const match = SIZE.exec(text);
  if (!match) {
    throw new SliceValueError(`memory size '${text}' is not ${SIZE_HELP}`);
  }
  const unit = match[2].toLowerCase();
  if (!(unit in UNITS)) {
    throw new SliceValueError(
      `memory size '${text}' has an unknown unit '${match[2]}'; use ${SIZE_HELP}`
    );
  }
  const size = Math.floor(parseFloat(match[1]) * UNITS[unit]);
  if (size <= 0) {
    throw new SliceValueError(
      `memory size '${text}' must be more than zero; use ${SIZE_HELP}`
    );
  }
  return size;
}

/** A size in the unit people read; the inverse of parseSize where it is exact. */
export function formatSize(size: number): string {
  const units: [string, number][] = [
    ['TiB', 2 ** 40],
    ['GiB', GIB],
    ['MiB', MIB],
    ['KiB', 2 ** 10]
  ];
  for (const [unit, factor] of units) {
    if (size >= factor) {
      const value = size / factor;
      return Number.isInteger(value)
        ? `${value}${unit}`
        : `${value.toFixed(1)}${unit}`;
    }
  }
  return `${size}B`;
}

/** An SM share in percent: a whole number 1..100 (a trailing `%` is allowed). */
export function parseSmShare(text: string): number {
  const digits = text.trim().replace(/%$/, '').trim();
  if (!/^\d+$/.test(digits) || +digits < 1 || +digits > 100) {
    throw new SliceValueError(`SM share '${text}' is not ${SM_SHARE_HELP}`);
  }
  return +digits;
}

/** A pacing policy: `hard` or `burst`. */
export function parsePolicy(text: string): Policy {
  const policy = text.trim().toLowerCase();
  if (!(POLICIES as readonly string[]).includes(policy)) {
    throw new SliceValueError(`policy '${text}' is not ${POLICY_HELP}`);
  }
  return policy as Policy;
}

/** "1.2 / 4.0 GiB": used over cap in the cap's unit (MiB below 1 GiB), one decimal for GiB. */
export function formatUsedOfCap(used: number, cap: number): string {
  if (cap < GIB) {
    return `${Math.round(used / MIB)} / ${Math.round(cap / MIB)} MiB`;
  }
  return `${(used / GIB).toFixed(1)} / ${(cap / GIB).toFixed(1)} GiB`;
}

/** The status-bar text of one slice: "GPU 1.2 / 4.0 GiB · SM 28 / 30 %". */
export function formatSliceSummary(
  memoryUsed: number,
  memoryCap: number,
  smUtil: number,
  smShare: number
): string {
  return `GPU ${formatUsedOfCap(memoryUsed, memoryCap)} · SM ${Math.round(smUtil)} / ${smShare} %`;
}

/** What the resize form or the start dialog holds, as typed. Empty fields mean "unchanged". */
export interface ISliceForm {
  memory: string;
  cores: string;
  policy: string;
}

/** A request body for PATCH /api/vgpu/slices/{id} or POST /api/vgpu/kernels. */
export interface ISliceRequest {
  memory?: string;
  cores?: number;
  policy?: Policy;
}

/** The request a form asks for, or the message of each field that is not accepted. */
export type FormCheck =
  | { ok: true; request: ISliceRequest }
  | { ok: false; errors: Partial<Record<keyof ISliceForm, string>> };

/**
 * Check a form field by field. Memory is sent as typed (the server parses it with sizes.py, and
 * its refusal names what was typed); cores and policy are sent in their parsed form.
 */
export function checkSliceForm(form: ISliceForm): FormCheck {
  const request: ISliceRequest = {};
  const errors: Partial<Record<keyof ISliceForm, string>> = {};
  const fields: [keyof ISliceForm, (text: string) => void][] = [
    [
      'memory',
      text => {
        parseSize(text);
        request.memory = text.trim();
      }
    ],
    ['cores', text => (request.cores = parseSmShare(text))],
    ['policy', text => (request.policy = parsePolicy(text))]
  ];
  for (const [field, parse] of fields) {
    const text = form[field];
    if (text.trim() === '') {
      continue;
    }
    try {
      parse(text);
    } catch (error) {
      if (!(error instanceof SliceValueError)) {
        throw error;
      }
      errors[field] = error.message;
    }
  }
  return Object.keys(errors).length
    ? { ok: false, errors }
    : { ok: true, request };
}
