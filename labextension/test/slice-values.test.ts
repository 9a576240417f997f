import { describe, expect, it } from 'vitest';

import {
  checkSliceForm,
  formatSize,
  formatSliceSummary,
  formatUsedOfCap,
  GIB,
  MIB,
  parsePolicy,
  parseSize,
  parseSmShare,
  SliceValueError
} from '../src/slice-values';

describe('parseSize accepts what sizes.py accepts', () => {
  it.each([
    ['512MiB', 512 * MIB],
    ['4GiB', 4 * GIB],
    ['4G', 4 * GIB],
    ['4gb', 4 * GIB],
    ['4096', 4096 * MIB],
    [' 1.5 GiB ', 1.5 * GIB],
    ['1T', 2 ** 40]
  ])('%s is %d bytes', (text, bytes) => {
    expect(parseSize(text)).toBe(bytes);
  });

  it.each(['', 'lots', '-1GiB', '4 GiB extra', '1e3'])(
    'refuses %j saying what is accepted',
    text => {
      expect(() => parseSize(text)).toThrow(
        /is not a size like 512MiB, 4GiB, 4G or a bare number of MiB/
      );
    }
  );

  it('names an unknown unit', () => {
    expect(() => parseSize('4XB')).toThrow(
      "memory size '4XB' has an unknown unit 'XB'"
    );
  });

  it('refuses zero', () => {
    expect(() => parseSize('0GiB')).toThrow(/must be more than zero/);
  });
});

describe('formatSize reads back what parseSize reads', () => {
  it.each([
    [512 * MIB, '512MiB'],
    [4 * GIB, '4GiB'],
    [1.5 * GIB, '1.5GiB'],
    [1000, '1000B']
  ])('%d bytes is %s', (bytes, text) => {
    expect(formatSize(bytes)).toBe(text);
    expect(parseSize(text)).toBe(bytes);
  });
});

describe('SM share is a whole percentage 1..100', () => {
  it.each([
    ['1', 1],
    ['30', 30],
    ['100', 100],
    ['40%', 40]
  ])('%s is %d', (text, share) => {
    expect(parseSmShare(text)).toBe(share);
  });

  it.each(['0', '101', '12.5', 'half', '-5'])('refuses %s', text => {
    expect(() => parseSmShare(text)).toThrow(
      `SM share '${text}' is not a whole percentage from 1 to 100`
    );
  });
});

describe('policy', () => {
  it('accepts hard and burst in any case', () => {
    expect(parsePolicy(' Burst ')).toBe('burst');
    expect(parsePolicy('hard')).toBe('hard');
  });

  it('refuses anything else', () => {
    expect(() => parsePolicy('soft')).toThrow(SliceValueError);
  });
});

describe('the status bar text', () => {
  it('reads "GPU 1.2 / 4.0 GiB · SM 28 / 30 %"', () => {
    expect(formatSliceSummary(1.2 * GIB, 4 * GIB, 27.6, 30)).toBe(
      'GPU 1.2 / 4.0 GiB · SM 28 / 30 %'
    );
  });

  it('uses MiB for caps below a GiB', () => {
    expect(formatUsedOfCap(100 * MIB, 512 * MIB)).toBe('100 / 512 MiB');
  });
});

describe('checkSliceForm', () => {
  it('sends only the fields that were filled, parsed', () => {
    expect(
      checkSliceForm({ memory: ' 6GiB ', cores: '40%', policy: '' })
    ).toEqual({
      ok: true,
      request: { memory: '6GiB', cores: 40 }
    });
  });

  it('an empty form asks for nothing', () => {
    expect(checkSliceForm({ memory: '', cores: ' ', policy: '' })).toEqual({
      ok: true,
      request: {}
    });
  });

  it('reports every refused field with its message', () => {
    const check = checkSliceForm({
      memory: 'big',
      cores: '0',
      policy: 'burst'
    });
    expect(check.ok).toBe(false);
    expect(check.ok ? {} : check.errors).toEqual({
      memory:
        "memory size 'big' is not a size like 512MiB, 4GiB, 4G or a bare number of MiB",
      cores: "SM share '0' is not a whole percentage from 1 to 100"
    });
  });
});
