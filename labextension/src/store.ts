/**
 * One poll of the server's slices and devices shared by the status bar and the sidebar, so two
 * views cost one request pair per period.
 */

import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  IDeviceModel,
  ISliceModel,
  listDevices,
  listSlices,
  VGPUServerError
} from './api';

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

  /** Why the last poll failed ('' when it did not), for the sidebar to say. */
  get error(): string {
    return this._error;
  }

  /**
   * Whether the last poll got no answer at all (the server is gone or restarting). No slice or
   * device is listed then: what the server said last may be about kernels that ended with it.
   * A server that answers with an error (a busy ledger's 503) keeps what it said last.
   */
  get unreachable(): boolean {
    return this._unreachable;
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
        this._unreachable = !(error instanceof VGPUServerError);
        if (this._unreachable) {
          this._slices = [];
          this._devices = [];
        }
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
      this._unreachable = false;
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
  private _unreachable = false;
  private _asked = 0;
  private _shown = 0;
  private _changed = new Signal<this, void>(this);
}
