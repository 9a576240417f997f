/**
 * Where JupyterLab says the user turned to a notebook's kernel, for the wake hints (wake.ts):
 * the notebook opened (its kernel known) or made current, a click or a tab into it (focus), an
 * edit of its active cell's source, a cell run scheduled (NotebookActions.executionScheduled).
 * Each calls WakeHints.turnedTo, which decides whether a request goes (suspended or lent only,
 * at most one per kernel per few seconds).
 */

import { NotebookActions, INotebookTracker } from '@jupyterlab/notebook';
import type { NotebookPanel } from '@jupyterlab/notebook';

import type { AttentionReason, WakeHints } from './wake';

function kernelOf(panel: NotebookPanel | null | undefined): string | undefined {
  return panel?.sessionContext.session?.kernel?.id;
}

export function followAttention(
  notebooks: INotebookTracker,
  hints: WakeHints
): void {
  const turnedTo = (
    panel: NotebookPanel | null | undefined,
    reason: AttentionReason
  ) => hints.turnedTo(kernelOf(panel), reason);

  const watch = (panel: NotebookPanel) => {
    // Opened: its kernel becomes known (a new session, or the page's reconnection to one).
    const onKernel = () => {
      if (notebooks.currentWidget === panel) {
        turnedTo(panel, 'open');
      }
    };
    panel.sessionContext.kernelChanged.connect(onKernel);
    // A click or a tab into the notebook: into a cell, its toolbar, its outputs.
    const onFocus = () => turnedTo(panel, 'focus');
    panel.node.addEventListener('focusin', onFocus);
    // Typing in its active cell (its source changes; outputs arriving do not count).
    let watched: NotebookPanel['content']['activeCell'] = null;
    const onChange = (_: unknown, change: { sourceChange?: unknown }) => {
      if (change.sourceChange) {
        turnedTo(panel, 'edit');
      }
    };
    const followCell = () => {
      watched?.model.sharedModel.changed.disconnect(onChange);
      watched = panel.content.activeCell;
      watched?.model.sharedModel.changed.connect(onChange);
    };
    panel.content.activeCellChanged.connect(followCell);
    followCell();
    panel.disposed.connect(() => {
      panel.node.removeEventListener('focusin', onFocus);
      watched?.model.sharedModel.changed.disconnect(onChange);
    });
  };
  notebooks.forEach(watch);
  notebooks.widgetAdded.connect((_, panel) => watch(panel));
  notebooks.currentChanged.connect((_, panel) => turnedTo(panel, 'focus'));
  NotebookActions.executionScheduled.connect((_, { notebook }) =>
    turnedTo(
      notebooks.find(panel => panel.content === notebook),
      'run'
    )
  );
}
