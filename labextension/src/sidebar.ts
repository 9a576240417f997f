/**
 * The "GPU slices" sidebar: every slice of the server with live memory and SM bars and resize
 * controls, then every device with what is still free on it.
 */

import { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { changeSuspension, ISliceModel, resizeSlice } from './api';
import {
  describeDevice,
  memoryFill,
  memoryLabel,
  messageTopic,
  podStopped,
  queueText,
  shownNotice,
  sliceMessage,
  sliceTitle,
  smLabel,
  stateExplained
} from './describe';
import { deviceMemoryLines } from './device-memory';
import { checkSliceForm, formatSize, POLICIES } from './slice-values';
import { SliceStore } from './store';

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  node.textContent = text;
  return node;
}

/** A labelled bar: fill is the used fraction, the mark (if any) a limit within the whole. */
class Bar {
  readonly node = element('div', 'jp-vgpu-Bar');

  constructor(name: string) {
    this.node.dataset.bar = name;
    this.node.append(this._label, this._track);
    this._track.append(this._fill, this._mark);
  }

  show(label: string, fill: number, mark?: number): void {
    this._label.textContent = label;
    this._fill.style.width = `${Math.min(100, Math.max(0, fill * 100))}%`;
    this._fill.classList.toggle('jp-vgpu-Bar-over', fill >= 0.999);
    this._mark.hidden = mark === undefined;
    this._mark.style.left = `${(mark ?? 0) * 100}%`;
  }

  private _label = element('div', 'jp-vgpu-Bar-label');
  private _track = element('div', 'jp-vgpu-Bar-track');
  private _fill = element('div', 'jp-vgpu-Bar-fill');
  private _mark = element('div', 'jp-vgpu-Bar-mark');
}

/**
 * One slice: its title, the server's warnings about it, the idle policy's notice (lowered, not
 * given back), where it stands in the line while it waits for room (a queued start; a suspended
 * or lent kernel's cell), the server's sentence about its state (a pod's: what it waits for, why
 * it failed), its bars, and a resize form whose fields stay as the user typed them (none for a
 * queued start: it has no slice to resize yet).
 */
class SliceRow {
  readonly node = element('li', 'jp-vgpu-Slice');

  constructor(
    readonly kernelId: string,
    private readonly _store: SliceStore,
    private readonly _trans: TranslationBundle
  ) {
    this.node.dataset.kernelId = kernelId;
    this._memory.name = 'memory';
    this._cores.name = 'cores';
    this._policy.name = 'policy';
    this._memory.setAttribute('aria-label', _trans.__('Memory cap'));
    this._cores.setAttribute('aria-label', _trans.__('SM share in percent'));
    this._policy.setAttribute('aria-label', _trans.__('Policy'));
    for (const policy of POLICIES) {
      this._policy.append(new Option(policy, policy));
    }
    // Once the user picks a policy, polls stop resetting the select until Apply.
    this._policy.addEventListener('change', () => {
      this._policyTouched = true;
    });
    this._apply.type = 'submit';
    this._apply.textContent = _trans.__('Apply');
    const form = this._form;
    form.append(
      element('label', '', _trans.__('Memory')),
      this._memory,
      element('label', '', _trans.__('SM %')),
      this._cores,
      element('label', '', _trans.__('Policy')),
      this._policy,
      element('span', ''),
      this._apply
    );
    this._suspension.type = 'button';
    this._suspension.addEventListener(
      'click',
      () => void this._toggleSuspension()
    );
    form.addEventListener('submit', event => {
      event.preventDefault();
      void this._resize();
    });
    this.node.append(
      this._title,
      this._warnings,
      this._notice,
      this._queue,
      this._state,
      this._memoryBar.node,
      this._smBar.node,
      form,
      this._suspension,
      this._message
    );
  }

  show(slice: ISliceModel): void {
    const { limits, usage } = slice;
    const title = sliceTitle(slice, this._trans);
    this._title.textContent = title;
    // The heading may be cut to the sidebar's width: its tooltip has it whole, and what a queued
    // or lent state means.
    this._title.title = [
      title,
      slice.kernel_id,
      stateExplained(slice, this._trans)
    ]
      .filter(Boolean)
      .join('\n');
    this.node.dataset.holder = slice.holder;
    this.node.dataset.state = slice.state;
    this._showWarnings(slice.warnings);
    this._showNotice(slice);
    this._showQueue(slice);
    this._showState(slice);
    this._memoryBar.show(memoryLabel(slice, this._trans), memoryFill(slice));
    // A suspended slice's bar: the GPU part empty, its track marked as held in host memory.
    this._memoryBar.node.classList.toggle(
      'jp-vgpu-Bar-inHost',
      slice.state === 'suspended'
    );
    // A lent or queued slice holds no room on the GPU at all: its track dotted.
    this._memoryBar.node.classList.toggle(
      'jp-vgpu-Bar-noRoom',
      slice.state === 'lent' || slice.state === 'queued'
    );
    this._smBar.show(
      smLabel(slice, this._trans),
      usage.sm_util / 100,
      limits.cores / 100
    );
    this._memory.placeholder = formatSize(limits.memory_bytes);
    this._cores.placeholder = `${limits.cores}`;
    if (!this._policyTouched) {
      this._policy.value = limits.policy;
    }
    this._form.hidden = slice.state === 'queued';
    this._showSuspension(slice);
    // What the row said last (Suspended., Resized., a refusal) goes once the state or limits it
    // was about change, as read by a poll begun after it was said.
    const said = this._said;
    if (
      said &&
      this._store.shown > said.asked &&
      messageTopic(slice) !== said.topic
    ) {
      this._say('', false, undefined);
    }
  }

  /**
   * Resume for a suspended slice, Suspend for a running local one (a pod's kernel cannot be
   * checkpointed from here); hidden otherwise.
   */
  private _showSuspension(slice: ISliceModel): void {
    const action =
      slice.state === 'suspended'
        ? 'resume'
        : slice.holder === 'local' && slice.state === 'running'
          ? 'suspend'
          : null;
    this._suspension.hidden = action === null;
    if (action && this._suspension.dataset.action !== action) {
      this._suspension.dataset.action = action;
      this._suspension.textContent =
        action === 'resume'
          ? this._trans.__('Resume')
          : this._trans.__('Suspend');
    }
  }

  /** POST .../resume or .../suspend; a refusal's reason shows under the row, as a resize's does. */
  private async _toggleSuspension(): Promise<void> {
    const action = this._suspension.dataset.action;
    if (action !== 'resume' && action !== 'suspend') {
      return;
    }
    await this._act(this._suspension, async () => {
      const answered = await changeSuspension(this.kernelId, action);
      const said =
        action === 'resume'
          ? this._trans.__('Resumed.')
          : this._trans.__('Suspended.');
      return [said, answered];
    });
  }

  /**
   * Runs a row's request with its button disabled: what it answers shows under the row, about
   * the slice it returned; a refusal's reason shows there instead. Then the list is read again.
   */
  private async _act(
    button: HTMLButtonElement,
    request: () => Promise<[string, ISliceModel]>
  ): Promise<void> {
    button.disabled = true;
    try {
      const [said, answered] = await request();
      this._say(said, false, answered);
      await this._store.refresh();
    } catch (error) {
      this._say((error as Error).message, true, this._current());
    } finally {
      button.disabled = false;
    }
  }

  /** One line per warning; the DOM changes only when the warnings do (polls repeat them). */
  private _showWarnings(warnings: readonly string[]): void {
    const shown = Array.from(this._warnings.children, line => line.textContent);
    if (
      shown.length === warnings.length &&
      shown.every((text, i) => text === warnings[i])
    ) {
      return;
    }
    this._warnings.replaceChildren(
      ...warnings.map(text => element('div', 'jp-vgpu-Warning', text))
    );
  }

  /** The idle policy's notice, whole, in the info colour; hidden when there is none. */
  private _showNotice(slice: ISliceModel): void {
    const notice = shownNotice(slice);
    if (this._notice.textContent !== notice) {
      this._notice.textContent = notice;
    }
    this._notice.hidden = !notice;
  }

  /** Where it stands in the line and what it waits for, whole; hidden while it waits for nothing. */
  private _showQueue(slice: ISliceModel): void {
    const text = queueText(slice, this._trans);
    if (this._queue.textContent !== text) {
      this._queue.textContent = text;
    }
    this._queue.hidden = !text;
  }

  /** The state's sentence, whole (it wraps; never cut), in the warn colour when the pod stopped. */
  private _showState(slice: ISliceModel): void {
    const message = sliceMessage(slice);
    if (this._state.textContent !== message) {
      this._state.textContent = message;
    }
    this._state.hidden = !message;
    this._state.classList.toggle('jp-vgpu-Warning', podStopped(slice));
  }

  private async _resize(): Promise<void> {
    const current = this._store.sliceOf(this.kernelId);
    const check = checkSliceForm({
      memory: this._memory.value,
      cores: this._cores.value,
      policy:
        this._policy.value === current?.limits.policy ? '' : this._policy.value
    });
    if (!check.ok) {
      this._say(Object.values(check.errors).join('; '), true, current);
      return;
    }
    if (!Object.keys(check.request).length) {
      this._say(
        this._trans.__(
          'Nothing to change: type a new memory cap or SM share, or pick another policy.'
        ),
        true,
        current
      );
      return;
    }
    await this._act(this._apply, async () => {
      const answered = await resizeSlice(this.kernelId, check.request);
      this._memory.value = this._cores.value = '';
      this._policyTouched = false;
      // A growth that does not fit yet waits in line (202): done by itself when room comes.
      const said = answered.queue
        ? this._trans.__(
            'Waits in line: %1. It happens by itself when room comes.',
            queueText(answered, this._trans)
          )
        : this._trans.__('Resized.');
      return [said, answered];
    });
  }

  /** The row's message, about the slice as `about` shows it (none: it stays until replaced). */
  private _say(
    message: string,
    refused: boolean,
    about: ISliceModel | undefined
  ): void {
    this._message.textContent = message;
    this._message.classList.toggle('jp-vgpu-refused', refused);
    this._said =
      message && about
        ? { topic: messageTopic(about), asked: this._store.asked }
        : null;
  }

  private _current(): ISliceModel | undefined {
    return this._store.sliceOf(this.kernelId);
  }

  private _title = element('div', 'jp-vgpu-Slice-title');
  private _warnings = element('div', 'jp-vgpu-Warnings');
  private _notice = element('div', 'jp-vgpu-Notice');
  private _queue = element('div', 'jp-vgpu-Queue');
  private _state = element('div', 'jp-vgpu-StateMessage');
  private _memoryBar = new Bar('memory');
  private _smBar = new Bar('sm');
  private _memory = element('input', 'jp-mod-styled');
  private _cores = element('input', 'jp-mod-styled');
  private _policy = element('select', 'jp-mod-styled');
  private _policyTouched = false;
  private _form = element('form', 'jp-vgpu-ResizeForm');
  private _apply = element(
    'button',
    'jp-mod-styled jp-mod-accept jp-vgpu-Apply'
  );
  private _suspension = element('button', 'jp-mod-styled jp-vgpu-Suspension');
  private _message = element('div', 'jp-vgpu-Message');
  private _said: { topic: string; asked: number } | null = null;
}

export class SliceSidebar extends Widget {
  constructor(
    private readonly _store: SliceStore,
    private readonly _trans: TranslationBundle
  ) {
    super();
    this.addClass('jp-vgpu-Sidebar');
    this._devicesHeading.textContent = _trans.__('Devices');
    this.node.append(
      element('h2', 'jp-vgpu-Heading', _trans.__('GPU slices')),
      this._status,
      this._slices,
      this._devicesHeading,
      this._devices
    );
    _store.changed.connect(this._update, this);
    this._update();
  }

  private _update(): void {
    const slices = this._store.slices;
    for (const [kernelId, row] of this._rows) {
      if (!slices.some(slice => slice.kernel_id === kernelId)) {
        row.node.remove();
        this._rows.delete(kernelId);
      }
    }
    for (const slice of slices) {
      let row = this._rows.get(slice.kernel_id);
      if (!row) {
        row = new SliceRow(slice.kernel_id, this._store, this._trans);
        this._rows.set(slice.kernel_id, row);
      }
      row.show(slice);
      this._slices.append(row.node); // keeps the server's order
    }
    const error = this._store.error;
    this._status.textContent = this._store.unreachable
      ? this._trans.__(
          'Cannot reach the server (%1): its GPU slices show again when it answers.',
          error
        )
      : error
        ? this._trans.__('The server did not list its GPU slices: %1', error)
        : slices.length
          ? ''
          : this._trans.__('No kernel holds a GPU slice.');
    // None while the server cannot be reached: no heading over nothing.
    this._devicesHeading.hidden = !this._store.devices.length;
    this._devices.replaceChildren(
      ...this._store.devices.map(device => {
        const item = element(
          'li',
          'jp-vgpu-Device',
          describeDevice(device, this._trans)
        );
        item.dataset.deviceIndex = `${device.index}`;
        // Why free memory is less than capacity less the slices' caps, when it is.
        for (const line of deviceMemoryLines(device, this._trans)) {
          const note = element('div', 'jp-vgpu-DeviceMemory', line.text);
          note.dataset.memory = line.kind;
          item.append(note);
        }
        return item;
      })
    );
  }

  private _rows = new Map<string, SliceRow>();
  private _status = element('div', 'jp-vgpu-Status');
  private _slices = element('ul', 'jp-vgpu-Slices');
  private _devicesHeading = element('h3', 'jp-vgpu-Heading');
  private _devices = element('ul', 'jp-vgpu-Devices');
}
