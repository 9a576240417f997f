/**
 * "New notebook on a GPU slice...": ask for a size (showing what is free, and as placeholders
 * what a field left empty gets), start a kernel in a slice of that size with
 * POST /api/vgpu/kernels, and open a new notebook on that kernel.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { KernelSpec } from '@jupyterlab/services';
import { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { getDefaults, ILimitsModel, startKernel } from './api';
import { describeDevice } from './describe';
import {
  POD_PROVISIONER_NAME,
  PROVISIONER_NAME,
  ISlicedKernelspec,
  slicedKernelspecs,
  startDefaults
} from './kernelspecs';
import { checkSliceForm, ISliceForm, POLICIES } from './slice-values';
import { SliceStore } from './store';

interface IStartChoice extends ISliceForm {
  kernelspec: string;
}

class StartForm extends Widget {
  constructor(
    kernelspecs: ISlicedKernelspec[],
    previous: IStartChoice,
    problem: string,
    store: SliceStore,
    serverDefaults: ILimitsModel | null,
    trans: TranslationBundle
  ) {
    super();
    this.addClass('jp-vgpu-StartForm');
    for (const spec of kernelspecs) {
      const label =
        spec.holder === 'pod'
          ? trans.__('%1 (Kubernetes pod)', spec.displayName)
          : spec.displayName;
      this._kernelspec.append(new Option(label, spec.name));
    }
    this._kernelspec.value = previous.kernelspec;
    const chosen = () =>
      kernelspecs.find(spec => spec.name === this._kernelspec.value);
    const defaults = () => startDefaults(chosen(), serverDefaults);
    const podNote = document.createElement('div');
    podNote.className = 'jp-vgpu-PodNote';
    podNote.textContent = trans.__(
      "This kernel starts as a Kubernetes pod: it may wait for the cluster's scheduler, and the GPU slices sidebar says what it waits for."
    );
    for (const policy of POLICIES) {
      this._policy.append(new Option(policy, policy));
    }
    // The policy shows the chosen kernelspec's default until the user picks one; only a
    // picked policy is sent (the server applies the same default to the others).
    this._policyPicked = !!previous.policy;
    this._policy.addEventListener('change', () => {
      this._policyPicked = true;
    });
    const showDefaults = () => {
      this._memory.placeholder = defaults().memory ?? '';
      this._cores.placeholder = defaults().cores ?? '';
      if (!this._policyPicked) {
        this._policy.value = defaults().policy ?? POLICIES[0];
      }
      podNote.hidden = chosen()?.holder !== 'pod';
    };
    this._kernelspec.addEventListener('change', showDefaults);
    this._policy.value = previous.policy;
    showDefaults();
    this._memory.value = previous.memory;
    this._cores.value = previous.cores;
    const field = (label: string, input: HTMLElement) => {
      const row = document.createElement('label');
      row.className = 'jp-vgpu-Field';
      row.append(label, input);
      return row;
    };
    const free = document.createElement('ul');
    free.className = 'jp-vgpu-Devices';
    free.append(
      ...store.devices.map(device => {
        const item = document.createElement('li');
        item.textContent = describeDevice(device, trans);
        return item;
      })
    );
    const message = document.createElement('div');
    message.className = 'jp-vgpu-Message jp-vgpu-refused';
    message.textContent = problem;
    this.node.append(
      field(trans.__('Kernel'), this._kernelspec),
      podNote,
      field(trans.__('Memory (512MiB, 4GiB, 4G or MiB)'), this._memory),
      field(trans.__('SM share (%, 1 to 100)'), this._cores),
      field(trans.__('Policy'), this._policy),
      document.createTextNode(trans.__('Free now:')),
      free,
      message
    );
  }

  getValue(): IStartChoice {
    return {
      kernelspec: this._kernelspec.value,
      memory: this._memory.value,
      cores: this._cores.value,
      policy: this._policyPicked ? this._policy.value : ''
    };
  }

  private _kernelspec = Object.assign(document.createElement('select'), {
    name: 'kernelspec',
    className: 'jp-mod-styled'
  });
  private _memory = Object.assign(document.createElement('input'), {
    name: 'memory',
    className: 'jp-mod-styled'
  });
  private _cores = Object.assign(document.createElement('input'), {
    name: 'cores',
    className: 'jp-mod-styled'
  });
  private _policyPicked = false;
  private _policy = Object.assign(document.createElement('select'), {
    name: 'policy',
    className: 'jp-mod-styled'
  });
}

/**
 * Ask until the user gives a size the server grants, or cancels; each refusal (from the form
 * check or the server) is shown in the next round with what was typed kept.
 * Returns the opened notebook's widget (the launcher that ran the command then closes, as it
 * does for its own notebook cards), or null if cancelled.
 */
export async function newNotebookOnSlice(
  docManager: IDocumentManager,
  specs: KernelSpec.ISpecModels | null,
  store: SliceStore,
  cwd: string,
  trans: TranslationBundle
): Promise<Widget | null> {
  const kernelspecs = slicedKernelspecs(specs);
  if (!kernelspecs.length) {
    await showDialog({
      title: trans.__('No GPU slice kernel'),
      body: trans.__(
        'No kernelspec uses the %1 or %2 provisioner; install one with: jupyter vgpu kernelspec install --user',
        PROVISIONER_NAME,
        POD_PROVISIONER_NAME
      ),
      buttons: [Dialog.okButton()]
    });
    return null;
  }
  // The dialog shows the freshest free capacity, and the server's defaults as placeholders.
  const [serverDefaults] = await Promise.all([
    getDefaults().catch(() => null),
    store.refresh().catch(() => undefined)
  ]);
  let choice: IStartChoice = {
    kernelspec: kernelspecs[0].name,
    memory: '',
    cores: '',
    policy: ''
  };
  let problem = '';
  for (;;) {
    const result = await showDialog({
      title: trans.__('New notebook on a GPU slice'),
      body: new StartForm(
        kernelspecs,
        choice,
        problem,
        store,
        serverDefaults,
        trans
      ),
      buttons: [
        Dialog.cancelButton(),
        Dialog.okButton({ label: trans.__('Start') })
      ]
    });
    if (!result.button.accept || !result.value) {
      return null;
    }
    choice = result.value;
    const check = checkSliceForm(choice);
    if (!check.ok) {
      problem = Object.values(check.errors).join('; ');
      continue;
    }
    let kernel: { id: string; name: string };
    try {
      ({ kernel } = await startKernel(choice.kernelspec, check.request, cwd));
    } catch (error) {
      problem = (error as Error).message;
      continue;
    }
    const model = await docManager.newUntitled({ path: cwd, type: 'notebook' });
    const widget = docManager.open(model.path, 'default', {
      id: kernel.id,
      name: kernel.name
    });
    void store.refresh();
    return widget ?? null;
  }
}
