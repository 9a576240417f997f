/**
 * Resume ahead of use: when the user turns to a kernel (opens or focuses its notebook, clicks
 * into or edits a cell, runs one) and its slice is suspended or lent, the lab tells the server
 * (POST /api/vgpu/slices/{kernel_id}/wake), which puts the kernel in the line to take its room
 * back now, so that its next cell finds it resumed. The state comes from the store's poll: no
 * request is made for a running kernel, and at most one per kernel per `interval` (a user
 * typing sends one at the first keystroke after a quiet period, not one a keystroke).
 *
 * No JupyterLab here (attention.ts connects it to the notebooks), so vitest runs it as it is.
 */

import { ISignal, Signal } from '@lumino/signaling';

import type { ISliceModel } from './api';

/** What the user did that says they turned to the kernel. */
export type AttentionReason = 'open' | 'focus' | 'edit' | 'run';

/** States of a kernel whose next cell would wait for its room: the hint helps them only. */
export const WAKEABLE: ReadonlySet<string> = new Set(['suspended', 'lent']);

/** Whether a wake hint helps the slice: a local slice that is suspended or lent. */
export function wantsWake(slice: ISliceModel | undefined): boolean {
  return !!slice && slice.holder === 'local' && WAKEABLE.has(slice.state);
}

/**
 * Whether a woken kernel is back: its slice is no longer resuming (its memory on its way back)
 * and has left the line. A slice gone is back too: nothing to wait for.
 */
export function resumed(slice: ISliceModel | undefined): boolean {
  return (
    !slice || (!wantsWake(slice) && slice.state !== 'resuming' && !slice.queue)
  );
}

/** At most one wake per kernel per this many milliseconds. */
export const WAKE_INTERVAL = 3000;

export interface IWakeHintsOptions {
  /** POST the wake of a kernel; its slice as the server answered (running: nothing to do). */
  send: (kernelId: string) => Promise<ISliceModel>;
  /** The slice of a kernel as the last poll saw it; undefined where unknown (not polled yet). */
  sliceOf: (kernelId: string) => ISliceModel | undefined;
  /** Milliseconds, as Date.now. */
  now?: () => number;
  interval?: number;
}

export class WakeHints {
  constructor(options: IWakeHintsOptions) {
    this._send = options.send;
    this._sliceOf = options.sliceOf;
    this._now = options.now ?? Date.now;
    this.interval = options.interval ?? WAKE_INTERVAL;
  }

  readonly interval: number;

  /** The `wakeHint` setting: off, no wake is sent (a suspended kernel resumes on its next cell). */
  enabled = true;

  /** A kernel started or stopped resuming (its id). */
  get changed(): ISignal<this, string> {
    return this._changed;
  }

  /**
   * The user turned to the kernel. Sends its wake where its slice is suspended or lent and no
   * wake went for it in the last `interval`; where its slice is not known yet (a page that has
   * not polled), the sign waits for the next poll (update) for up to `interval`. Whether a wake
   * was sent.
   */
  turnedTo(kernelId: string | undefined, reason: AttentionReason): boolean {
    if (!kernelId || !this.enabled) {
      return false;
    }
    const slice = this._sliceOf(kernelId);
    if (!slice) {
      this._pending.set(kernelId, { at: this._now(), reason });
      return false;
    }
    this._pending.delete(kernelId);
    if (!wantsWake(slice)) {
      return false;
    }
    const last = this._sent.get(kernelId);
    const now = this._now();
    if (last !== undefined && now - last < this.interval) {
      return false;
    }
    this._sent.set(kernelId, now);
    this._setResuming(kernelId, true);
    this._send(kernelId).then(
      answered => {
        if (resumed(answered)) {
          this._setResuming(kernelId, false); // it ran already
        }
      },
      reason => {
        console.warn(`jupyter-vgpu: the wake of ${kernelId} failed`, reason);
        this._setResuming(kernelId, false);
      }
    );
    return true;
  }

  /** Whether a wake went for the kernel and it has not been seen back (resumed) since. */
  isResuming(kernelId: string | undefined): boolean {
    return !!kernelId && this._resuming.has(kernelId);
  }

  /**
   * After each poll: a kernel that resumed (its slice running and out of the line, or gone) is
   * no longer resuming; a sign that waited for the kernel's slice to be known is acted on.
   */
  update(): void {
    for (const kernelId of [...this._resuming]) {
      if (resumed(this._sliceOf(kernelId))) {
        this._setResuming(kernelId, false);
        // Back: a later suspend is a new one, and the next sign of the user wakes it at once.
        this._sent.delete(kernelId);
      }
    }
    const now = this._now();
    for (const [kernelId, { at, reason }] of [...this._pending]) {
      if (now - at > this.interval) {
        this._pending.delete(kernelId);
      } else if (this._sliceOf(kernelId)) {
        this.turnedTo(kernelId, reason);
      }
    }
  }

  private _setResuming(kernelId: string, resuming: boolean): void {
    if (this._resuming.has(kernelId) === resuming) {
      return;
    }
    if (resuming) {
      this._resuming.add(kernelId);
    } else {
      this._resuming.delete(kernelId);
    }
    this._changed.emit(kernelId);
  }

  private readonly _send: IWakeHintsOptions['send'];
  private readonly _sliceOf: IWakeHintsOptions['sliceOf'];
  private readonly _now: () => number;
  private readonly _sent = new Map<string, number>();
  private readonly _pending = new Map<
    string,
    { at: number; reason: AttentionReason }
  >();
  private readonly _resuming = new Set<string>();
  private readonly _changed = new Signal<this, string>(this);
}
