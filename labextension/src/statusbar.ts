/**
 * Status-bar item: the slice of the active notebook's kernel (and a pod's state while it is not
 * running), hidden when it has none; in the warn colour, with the warnings in its tooltip, while
 * the server has warnings about the slice or its pod failed, exited or is gone; with a marker,
 * and the notice in its tooltip, while the idle policy has a notice about the slice (lowered,
 * suspended); "GPU suspended · 300MiB in host memory", in the secondary colour, while the
 * kernel is suspended, and "GPU lent · ..." while its room is lent; while its start or its cell
 * waits in the line for room, where it stands ("GPU queued · 2nd in line for GPU 0 · ..."), in
 * the info colour; "GPU suspending · ..." and "GPU resuming · ..." while its memory moves,
 * and from the lab's wake hint until it runs, in the info colour.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { TranslationBundle } from '@jupyterlab/translation';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import {
  resumingStatusText,
  shownNotice,
  sliceNeedsAttention,
  sliceStatusText,
  sliceTooltip,
  sliceWaits
} from './describe';
import { SliceStore } from './store';
import { WakeHints } from './wake';

/** States in which a slice's memory is on its way to or from host memory. */
const MOVING: ReadonlySet<string> = new Set(['suspending', 'resuming']);

export class SliceStatusItem extends Widget {
  constructor(
    private readonly _store: SliceStore,
    private readonly _notebooks: INotebookTracker,
    private readonly _trans: TranslationBundle,
    private readonly _wake: WakeHints | null = null
  ) {
    super();
    this.addClass('jp-vgpu-StatusItem');
    _store.changed.connect(this._update, this);
    _wake?.changed.connect(this._update, this);
    _notebooks.currentChanged.connect(this._update, this);
    _notebooks.currentChanged.connect(this._followKernel, this);
    this._followKernel();
  }

  /** Whether the active notebook's kernel has a slice (the status bar hides the item if not). */
  get hasSlice(): boolean {
    return this._hasSlice;
  }

  get hasSliceChanged(): ISignal<this, void> {
    return this._hasSliceChanged;
  }

  private _followKernel(): void {
    this._watched?.kernelChanged.disconnect(this._update, this);
    this._watched = this._notebooks.currentWidget?.sessionContext ?? null;
    this._watched?.kernelChanged.connect(this._update, this);
  }

  private _update(): void {
    const kernelId =
      this._notebooks.currentWidget?.sessionContext.session?.kernel?.id;
    const slice = this._store.sliceOf(kernelId);
    if (slice) {
      const woken = !!this._wake?.isResuming(kernelId);
      this.node.textContent = woken
        ? resumingStatusText(slice, this._trans)
        : sliceStatusText(slice, this._trans);
      this.node.title = sliceTooltip(slice, this._trans);
      this.toggleClass('jp-vgpu-mod-warned', sliceNeedsAttention(slice));
      this.toggleClass('jp-vgpu-mod-noticed', !!shownNotice(slice));
      this.toggleClass('jp-vgpu-mod-suspended', slice.state === 'suspended');
      this.toggleClass('jp-vgpu-mod-lent', slice.state === 'lent');
      this.toggleClass('jp-vgpu-mod-queued', slice.state === 'queued');
      this.toggleClass('jp-vgpu-mod-waiting', sliceWaits(slice));
      this.toggleClass(
        'jp-vgpu-mod-resuming',
        woken || MOVING.has(slice.state)
      );
      this.node.dataset.state = slice.state;
    }
    if (this._hasSlice !== !!slice) {
      this._hasSlice = !!slice;
      this._hasSliceChanged.emit();
    }
  }

  private _watched: ISessionContext | null = null;
  private _hasSlice = false;
  private _hasSliceChanged = new Signal<this, void>(this);
}
