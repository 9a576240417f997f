/**
 * jupyter-vgpu's JupyterLab plugin: status bar, "GPU slices" sidebar, start-on-a-slice command,
 * the idle policy's notices about the active notebook's kernel as notifications, and the wake
 * hint that resumes a suspended kernel when its user turns to it.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { ILauncher } from '@jupyterlab/launcher';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { LabIcon } from '@jupyterlab/ui-components';

// The sidebar, the status item and their store are built in activate(): they load with the plugin.
import { listNotices, wakeSlice } from './api';
import { followAttention } from './attention';
import { markStartRefusals } from './refusal';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { IdleNotices } from './notices';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { SliceSidebar } from './sidebar';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { SliceStatusItem } from './statusbar';
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { SliceStore } from './store';
import { WakeHints } from './wake';

const PLUGIN_ID = 'jupyter-vgpu:plugin';
const COMMAND_NEW_NOTEBOOK = 'jupyter-vgpu:new-notebook-on-slice';
const COMMAND_SHOW_SIDEBAR = 'jupyter-vgpu:show-slices';

const gpuIcon = new LabIcon({
  name: 'jupyter-vgpu:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M7 7h10v10H7zM9 9v6h6V9zM9 2h2v4H9zm4 0h2v4h-2zM9 18h2v4H9zm4 0h2v4h-2zM2 9h4v2H2zm0 4h4v2H2zm16-4h4v2h-4zm0 4h4v2h-4z"/>' +
    '</g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'GPU slices of notebook kernels: status bar, sidebar with live resize, start with a chosen size.',
  autoStart: true,
  requires: [IDocumentManager, INotebookTracker],
  optional: [
    ISettingRegistry,
    ITranslator,
    IStatusBar,
    ICommandPalette,
    ILauncher,
    ILayoutRestorer
  ],
  activate: (
    app: JupyterFrontEnd,
    docManager: IDocumentManager,
    notebooks: INotebookTracker,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    launcher: ILauncher | null,
    restorer: ILayoutRestorer | null
  ) => {
    const trans = (translator ?? nullTranslator).load('jupyter_vgpu');
    const store = new SliceStore(1000);
    // A refused kernel start, in JupyterLab's own error dialog, wraps instead of being cut off,
    // and one that a smaller slice answers says how to ask for one here.
    markStartRefusals(
      trans.__(
        'To start a notebook with a smaller slice: "New notebook on a GPU slice..." in the Launcher or the command palette.'
      )
    );
    // Resume ahead of use: the user turning to a suspended or lent kernel wakes it (wake.ts).
    const wake = new WakeHints({
      send: wakeSlice,
      sliceOf: kernelId => store.sliceOf(kernelId)
    });
    store.changed.connect(() => wake.update());
    followAttention(notebooks, wake);

    const sidebar = new SliceSidebar(store, trans);
    sidebar.id = 'jupyter-vgpu-sidebar';
    sidebar.title.icon = gpuIcon;
    sidebar.title.caption = trans.__('GPU slices');
    app.shell.add(sidebar, 'left', { rank: 900 });
    restorer?.add(sidebar, sidebar.id);

    if (statusBar) {
      const item = new SliceStatusItem(store, notebooks, trans, wake);
      statusBar.registerStatusItem(PLUGIN_ID, {
        item,
        align: 'left',
        rank: 5,
        isActive: () => item.hasSlice,
        activeStateChanged: item.hasSliceChanged
      });
    }

    // The idle policy's notices about the active notebook's kernel, each told once: a slice's
    // (lowered, not given back) for a while, a stopped kernel's until dismissed.
    const notices = new IdleNotices(
      listNotices,
      (kind, message) =>
        kind === 'warning'
          ? Notification.warning(message, { autoClose: false })
          : Notification.info(message, { autoClose: 15000 }),
      trans
    );
    const checkNotices = () => {
      if (store.unreachable) {
        return; // nothing is known of the kernels: a slice not listed is not a slice gone
      }
      const panel = notebooks.currentWidget;
      notices
        .check(
          panel && {
            key: panel.id,
            path: panel.context.path,
            kernelId: panel.sessionContext.session?.kernel?.id
          },
          store.slices
        )
        .catch(reason =>
          console.error('jupyter-vgpu: cannot tell the idle notices', reason)
        );
    };
    store.changed.connect(checkNotices);
    notebooks.currentChanged.connect(checkNotices);

    app.commands.addCommand(COMMAND_NEW_NOTEBOOK, {
      label: trans.__('New notebook on a GPU slice...'),
      caption: trans.__(
        'Start a kernel in a GPU slice of the size you choose and open a notebook on it'
      ),
      icon: args => (args.isPalette ? undefined : gpuIcon),
      describedBy: {
        args: {
          type: 'object',
          properties: {
            cwd: {
              type: 'string',
              description: trans.__(
                'The folder to create the notebook in (the root by default)'
              )
            },
            isPalette: {
              type: 'boolean',
              description: trans.__('Whether the command palette runs it')
            }
          }
        }
      },
      execute: async args => {
        // The dialog loads the first time it is asked for, not with the application.
        const { newNotebookOnSlice } = await import('./start-dialog');
        return newNotebookOnSlice(
          docManager,
          app.serviceManager.kernelspecs.specs,
          store,
          (args.cwd as string) ?? '',
          trans
        );
      }
    });
    app.commands.addCommand(COMMAND_SHOW_SIDEBAR, {
      label: trans.__('Show GPU slices'),
      describedBy: { args: { type: 'object', properties: {} } },
      execute: () => app.shell.activateById(sidebar.id)
    });
    const category = trans.__('GPU slices');
    palette?.addItem({ command: COMMAND_NEW_NOTEBOOK, category });
    palette?.addItem({ command: COMMAND_SHOW_SIDEBAR, category });
    launcher?.add({
      command: COMMAND_NEW_NOTEBOOK,
      category: trans.__('Notebook'),
      rank: 50,
      // The launcher draws a Notebook card's image from kernelIconUrl only (else the label's
      // first letter on an orange square), not from the command's icon.
      kernelIconUrl: `data:image/svg+xml,${encodeURIComponent(gpuIcon.svgstr)}`
    });

    settingRegistry
      ?.load(PLUGIN_ID)
      .then(settings => {
        const apply = () => {
          store.interval = settings.get('refreshInterval').composite as number;
          wake.enabled = settings.get('wakeHint').composite as boolean;
        };
        settings.changed.connect(apply);
        apply();
      })
      .catch(reason =>
        console.error('jupyter-vgpu: cannot load its settings', reason)
      );
  }
};

export default plugin;
