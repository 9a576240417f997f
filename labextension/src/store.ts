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

  /** Why the last poll failed ('' when it did not), for the sidebar to say. */
  get error(): string {
    return this._error;
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
    try {
      [this._slices, this._devices] = await Promise.all([
        listSlices(),
        listDevices()
      ]);
      this._error = '';
    } catch (error) {
      this._error = (error as Error).message;
      this._changed.emit();
      throw error; // lets the poll back off while the server is away
    }
    this._changed.emit();
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private _poll: Poll;
  private _slices: ISliceModel[] = [];
  private _devices: IDeviceModel[] = [];
  private _error = '';
  private _changed = new Signal<this, void>(this);
}
