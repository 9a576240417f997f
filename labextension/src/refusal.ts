/**
 * A kernel start the server refused (no room on the GPU, the server's own limits, a size it does
 * not allow), read whole in JupyterLab's "Error Starting Kernel" dialog.
 *
 * JupyterLab's SessionContext makes that dialog itself, with the server's message in a `<pre>`
 * that does not wrap, so a refusal longer than the dialog was cut off just where it says what is
 * free and what to do. No extension can swap that dialog for its own, so this one marks the
 * dialogs whose message is a refusal of this server's, and the extension's style wraps them.
 */

import { Dialog } from '@jupyterlab/apputils';

/** How every refused start of the server begins (jupyter_vgpu/server/errors.py, StartRefused). */
export const REFUSAL_PREFIX = 'Kernel not started. ';
/** What the refusal of a slice larger than any GPU says (jupyter_vgpu/manager.py). */
const NEVER_FITS = ' can never fit: ';
/** The class of a dialog that shows a refused start (style/index.css wraps its message). */
export const REFUSAL_CLASS = 'jp-vgpu-mod-startRefusal';

export function isStartRefusal(message: string): boolean {
  return message.startsWith(REFUSAL_PREFIX);
}

/**
 * What to do in JupyterLab about a refused start, or '': the server says "Ask for 16GiB or less" to a
 * slice larger than any GPU, but a launcher card or the kernel picker starts the kernelspec's
 * size, which the user cannot change there.
 */
export function refusalHint(message: string, hint: string): string {
  return isStartRefusal(message) && message.includes(NEVER_FITS) ? hint : '';
}

/** The message a dialog shows in its body's first `<pre>` (JupyterLab's error dialogs), if any. */
function preformattedMessage(dialog: Dialog<unknown>): string {
  return dialog.node.querySelector('.jp-Dialog-body pre')?.textContent ?? '';
}

/**
 * From now on, mark every dialog whose message is a refused start, once it has rendered, and
 * add `hint` under a refusal that a smaller slice answers.
 */
export function markStartRefusals(hint: string): void {
  Dialog.tracker.widgetAdded.connect((_, dialog) => {
    dialog.ready
      .then(() => {
        const message = preformattedMessage(dialog);
        if (!isStartRefusal(message)) {
          return;
        }
        dialog.addClass(REFUSAL_CLASS);
        const text = refusalHint(message, hint);
        if (text) {
          const note = document.createElement('p');
          note.className = 'jp-vgpu-RefusalHint';
          note.textContent = text;
          dialog.node.querySelector('.jp-Dialog-body')?.append(note);
        }
      })
      .catch(reason =>
        console.error('jupyter-vgpu: cannot read a dialog', reason)
      );
  });
}
