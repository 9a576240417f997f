/**
 * One poll of the server's slices and devices shared by the status bar and the sidebar, so two
 * views cost one request pair per period.
 */

import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { IDeviceModel, ISliceModel, listDevices, listSlices } from './api';

export class SliceStore {
  constructor(interval: number) {
    this._poll = new Poll({
      factory: () => this.refresh(),
      frequency: { interval, backoff: true, max: 30 * interval },
      name: 'jupyter-vgpu:slices',
      standby: 'when-hidden'
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get slices(): readonly ISliceModel[] {
    return this._slices;
  }

  get devices(): readonly IDeviceModel[] {
    return this._devices;
  }

  /**
   * Why the last poll failed ('' when it did not), for the sidebar to say. While it fails no
   * slice or device is listed: what the server said last may be about kernels that are gone.
   */
  get error(): string {
    return this._error;
  }

  /** How many fetches have begun: a view notes it when it says something about a slice. */
  get asked(): number {
    return this._asked;
  }

  /** Which fetch (counted as `asked`) the slices come from: answers older than it are dropped. */
  get shown(): number {
    return this._shown;
  }

  sliceOf(kernelId: string | undefined): ISliceModel | undefined {
    return this._slices.find(slice => slice.kernel_id === kernelId);
  }

  set interval(interval: number) {
    this._poll.frequency = {
      ...this._poll.frequency,
      interval,
      max: 30 * interval
    };
  }

  /** Fetch now (after a resize or a start), instead of waiting for the next tick. */
  async refresh(): Promise<void> {
    const asked = ++this._asked;
    let answer: [ISliceModel[], IDeviceModel[]];
    try {
      answer = await Promise.all([listSlices(), listDevices()]);
    } catch (error) {
      if (asked > this._shown) {
        this._shown = asked;
        this._slices = [];
        this._devices = [];
        this._error = (error as Error).message;
        this._changed.emit();
      }
      throw error; // lets the poll back off while the server is away
    }
    // A poll and a refresh after an action overlap: the older answer must not undo the newer.
    if (asked > this._shown) {
      this._shown = asked;
      [this._slices, this._devices] = answer;
      this._error = '';
      this._changed.emit();
    }
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private _poll: Poll;
  private _slices: ISliceModel[] = [];
  private _devices: IDeviceModel[] = [];
  private _error = '';
  private _asked = 0;
  private _shown = 0;
  private _changed = new Signal<this, void>(this);
}
