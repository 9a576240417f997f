/**
 * The idle policy's notices, told once in the notebook: when the active notebook's kernel's slice
 * gets a new notice (lowered, or not given back), and when that kernel's slice is gone and the
 * server says it stopped the kernel as idle (GET /api/vgpu/notices). Polls repeat a notice; this
 * tells each one once.
 *
 * No JupyterLab here: index.ts gives it the active notebook and a `notify` that calls
 * `Notification`, so the decisions are tested alone.
 */

import type { TranslationBundle } from '@jupyterlab/translation';

import type { ISliceModel } from './api';
import { sliceNotice } from './describe';

/** The active notebook: a key of its own (the widget's id), its path and its kernel, if any. */
export interface IActiveNotebook {
  key: string;
  path: string;
  /** undefined while the notebook has no kernel (not started yet, or gone). */
  kernelId?: string;
}

/**
 * How a notice is told: `info` for a slice's notice (the kernel still runs), `warning` for a
 * kernel the server stopped (what it held is lost).
 */
export type NoticeKind = 'info' | 'warning';

export type Notify = (kind: NoticeKind, message: string) => void;

/** Kernel id -> why the server stopped it (GET /api/vgpu/notices). */
export type FetchNotices = () => Promise<Record<string, string>>;

export class IdleNotices {
  constructor(
    private readonly _fetchNotices: FetchNotices,
    private readonly _notify: Notify,
    private readonly _trans: TranslationBundle
  ) {}

  /**
   * Called after each poll of the slices (and when the active notebook changes): tells what is
   * new about the active notebook's kernel. Resolves once any request it made is answered.
   */
  async check(
    active: IActiveNotebook | null,
    slices: readonly ISliceModel[]
  ): Promise<void> {
    if (!active) {
      return;
    }
    // A stopped kernel leaves its notebook without one: follow the kernel it had.
    if (active.kernelId) {
      this._kernels.set(active.key, active.kernelId);
    }
    const kernelId = this._kernels.get(active.key);
    if (!kernelId) {
      return;
    }
    const slice = slices.find(item => item.kernel_id === kernelId);
    if (slice) {
      this._sliced.set(kernelId, slice.path || active.path);
      this._tellSliceNotice(
        kernelId,
        sliceNotice(slice),
        slice.path || active.path
      );
      return;
    }
    const path = this._sliced.get(kernelId);
    if (path === undefined) {
      return; // not a sliced kernel, or its end is already dealt with
    }
    // Its slice is gone: ask once (the next poll must not ask again while this one waits).
    this._sliced.delete(kernelId);
    this._told.delete(kernelId);
    let notices: Record<string, string>;
    try {
      notices = await this._fetchNotices();
    } catch {
      this._sliced.set(kernelId, path); // the server is away: ask at the next poll
      return;
    }
    const notice = notices[kernelId];
    if (notice && !this._stopped.has(kernelId)) {
      this._stopped.add(kernelId);
      this._notify(
        'warning',
        this._trans.__('The kernel of %1: %2', path || kernelId, notice)
      );
    }
  }

  /** A slice's notice, told when it is new for the kernel (not when a poll repeats it). */
  private _tellSliceNotice(
    kernelId: string,
    notice: string,
    path: string
  ): void {
    if (!notice) {
      this._told.delete(kernelId); // a later notice, even the same words, is news again
      return;
    }
    if (this._told.get(kernelId) === notice) {
      return;
    }
    this._told.set(kernelId, notice);
    this._notify(
      'info',
      this._trans.__('GPU slice of %1: %2', path || kernelId, notice)
    );
  }

  /** Notebook key -> the last kernel it was seen with. */
  private _kernels = new Map<string, string>();
  /** Kernels seen with a slice while active -> their notebook's path. */
  private _sliced = new Map<string, string>();
  /** Kernel -> the slice notice last told. */
  private _told = new Map<string, string>();
  /** Kernels whose stop was told. */
  private _stopped = new Set<string>();
}
