// The step-through page's behaviour: draw the graph from the walk's numbers, then reveal it one step at a time.
"use strict";

const walk = JSON.parse(document.getElementById("walk").textContent);

// How the graph is laid out: the chain of nodes in one row, the tensors each one also takes from above it.
const CHAIN = ["x", "z1", "h", "z2", "y", "loss"];
const ABOVE = {z1: ["W1", "b1"], z2: ["W2", "b2"], loss: ["t"]};
const GAP = 46;  // px between two boxes of the chain
const EDGE_ROOM = 46;  // px between the row above and the chain: the arrows and their labels
let laneTop = 0;  // where the labels of the chain's edges sit, in a lane below the chain (set by layOut)

// ---- numbers -------------------------------------------------------------------------------------------

/** A number as the page writes it: exact small integers as they are, others to 4 significant digits. */
function fmt(v) {
  if (Number.isInteger(v) && Math.abs(v) < 1000) return String(v);
  const a = Math.abs(v);
  return a >= 1e-3 && a < 1e4 ? v.toPrecision(4) : v.toExponential(3);
}

/** The number a ref names: [tensor, "value" or "grad", "i,j"]. */
function lookup([tensor, kind, index]) {
  let v = walk.tensors[tensor][kind];
  for (const i of index ? index.split(",") : []) v = v[Number(i)];
  return v;
}

/** One number, as an element that says which it is (data-tensor, data-kind, data-index). */
function numberElement(ref, parens = false) {
  const span = document.createElement("span");
  span.className = "num " + ref[1];
  [span.dataset.tensor, span.dataset.kind, span.dataset.index] = ref;
  const v = lookup(ref);
  span.textContent = fmt(v);
  if (!parens || v >= 0) return span;
  const wrap = document.createElement("span");  // a negative factor in a product: (-0.25)
  wrap.append("(", span, ")");
  return wrap;
}

function el(tag, className, ...children) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  e.append(...children);
  return e;
}

/** A tensor of shape (r, c), (c,) or () as a grid of numbers, one row of the grid per row of the tensor. */
function matrix(tensor, kind) {
  const shape = walk.tensors[tensor].shape;
  const rows = shape.length === 2 ? shape[0] : 1, cols = shape.length === 0 ? 1 : shape[shape.length - 1];
  const grid = el("div", "matrix");
  grid.style.gridTemplateColumns = `repeat(${cols}, auto)`;
  for (let i = 0; i < rows; i++)
    for (let j = 0; j < cols; j++) {
      const index = shape.length === 2 ? `${i},${j}` : shape.length === 1 ? `${j}` : "";
      grid.append(numberElement([tensor, kind, index]));
    }
  return grid;
}

// ---- the graph -----------------------------------------------------------------------------------------

const revealedAt = {};  // "tensor/kind" -> the step that reveals it
walk.steps.forEach((s, k) => s.reveal.forEach(([tensor, kind]) => { revealedAt[`${tensor}/${kind}`] = k; }));

const graph = document.getElementById("graph");
const boxes = {};
for (const node of walk.nodes) {
  const t = walk.tensors[node.id];
  const shape = t.shape.length ? `(${t.shape.join(", ")})` : "scalar";
  const box = el("div", "node", el("div", "caption", node.caption), el("div", "note", `${shape} · ${node.note}`));
  box.id = "node-" + node.id;
  const values = el("div", "values", matrix(node.id, "value"));
  values.dataset.step = revealedAt[`${node.id}/value`];
  box.append(values);
  if ("grad" in t) {
    const grads = el("div", "grads", el("div", "grad-caption", `dL/d${node.id}`), matrix(node.id, "grad"));
    grads.dataset.step = revealedAt[`${node.id}/grad`];
    box.append(grads);
  }
  graph.append(box);
  boxes[node.id] = box;
}

// The edge each backward step's gradient flows along, labelled with that step's formula.
const edgeStep = {};
walk.steps.forEach((s, k) => { if (s.edge) edgeStep[s.edge.join(">")] = k; });
const edgeLabels = {};
for (const [from, to] of walk.edges) {
  const k = edgeStep[`${from}>${to}`];
  if (k === undefined) continue;
  const [lhs, rhs] = walk.steps[k].formula.split(" = ");
  const label = el("div", "edge-label", `${lhs} = ${rhs}`);
  label.dataset.step = k;
  graph.append(label);
  edgeLabels[`${from}>${to}`] = label;
}

/** Place the boxes once, measured with everything in them shown (before the first step hides most of it). */
function layOut() {
  const place = (id, left, top) => { boxes[id].style.left = left + "px"; boxes[id].style.top = top + "px"; };
  for (const id in boxes) boxes[id].style.width = boxes[id].offsetWidth + "px";  // kept as gradients come and go
  const chainTop = Math.max(...Object.values(ABOVE).flat().map(id => boxes[id].offsetHeight)) + EDGE_ROOM;
  let left = 0;
  for (const id of CHAIN) {
    const centre = left + boxes[id].offsetWidth / 2, above = ABOVE[id] || [];
    place(id, left, chainTop);
    if (above.length === 1) place(above[0], centre - boxes[above[0]].offsetWidth / 2, 0);
    if (above.length === 2) {  // the weight left of the node's centre, the bias right of it
      place(above[0], centre - 12 - boxes[above[0]].offsetWidth, 0);
      place(above[1], centre + 12, 0);
    }
    left += boxes[id].offsetWidth + GAP;
  }
  const shift = Math.max(0, -Math.min(...Object.values(boxes).map(b => b.offsetLeft)));
  for (const id in boxes) boxes[id].style.left = boxes[id].offsetLeft + shift + "px";
  const chainBottom = chainTop + Math.max(...CHAIN.map(id => boxes[id].offsetHeight));
  laneTop = chainBottom + 10;
  graph.style.height = laneTop + 24 + "px";
  graph.style.width = left - GAP + shift + "px";
}
layOut();

const SVG = "http://www.w3.org/2000/svg";
const svg = document.getElementById("edges");

function svgElement(tag, attributes) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attributes)) e.setAttribute(k, v);
  return e;
}

/** Draw every edge as an arrow from its input to the node computed from it, and place the shown labels.
 *  An edge is "forward" while its node is being computed, "current" while its gradient is arriving (drawn
 *  pointing back, as the gradient flows), "flowed" once its gradient has gone through it, else "plain". */
function drawEdges(step, asking) {
  const kinds = ["plain", "forward", "flowed", "current"];
  svg.replaceChildren(svgElement("defs", {}));
  for (const kind of kinds) {
    const marker = svgElement("marker", {id: "arrow-" + kind, viewBox: "0 0 10 10", refX: 9, refY: 5,
                                         markerWidth: 10, markerHeight: 10, markerUnits: "userSpaceOnUse",
                                         orient: "auto"});
    marker.append(svgElement("path", {d: "M0,0 L10,5 L0,10 z", class: "tip " + kind}));
    if (kind === "current" || kind === "flowed") marker.setAttribute("refX", 5);  // centred on the midpoint
    svg.firstChild.append(marker);
  }
  const box = id => ({left: boxes[id].offsetLeft, top: boxes[id].offsetTop, width: boxes[id].offsetWidth,
                      right: boxes[id].offsetLeft + boxes[id].offsetWidth,
                      bottom: boxes[id].offsetTop + boxes[id].offsetHeight});
  const now = walk.steps[step];
  for (const [from, to] of walk.edges) {
    const a = box(from), b = box(to), label = edgeLabels[`${from}>${to}`];
    const k = edgeStep[`${from}>${to}`];
    const kind = k !== undefined && (k < step || (k === step && !asking)) ? (k === step ? "current" : "flowed")
               : now.phase === "forward" && now.node === to ? "forward" : "plain";
    let x1, y1, x2, y2;
    if ((ABOVE[to] || []).includes(from)) {  // from above: down into the node's top, its inputs side by side
      const inputs = ABOVE[to];
      x1 = (a.left + a.right) / 2;
      y1 = a.bottom;
      x2 = b.left + b.width * (inputs.indexOf(from) + 1) / (inputs.length + 1);
      y2 = b.top - 1;
      if (label) {  // just below the box it comes from
        label.style.left = x1 - label.offsetWidth / 2 + "px";
        label.style.top = y1 + 8 + "px";
      }
    } else {  // from the left, level with the rows of the examples
      const rows = boxes[to].querySelector(".values");
      y1 = y2 = boxes[to].offsetTop + rows.offsetTop + rows.offsetHeight / 2;
      x1 = a.right;
      x2 = b.left - 1;
      if (label) {  // in the lane below the chain, joined to its arrow by a dotted line
        const mid = (x1 + x2) / 2;
        label.style.left = mid - label.offsetWidth / 2 + "px";
        label.style.top = laneTop + "px";
        if (kind === "current" || kind === "flowed")
          svg.append(svgElement("line", {x1: mid, y1: y1 + 7, x2: mid, y2: laneTop, class: "leader " + kind}));
      }
    }
    if (kind === "current" || kind === "flowed") {  // the gradient flows back: an arrowhead on the way, pointing back
      const mx = x2 + 0.4 * (x1 - x2), my = y2 + 0.4 * (y1 - y2);  // nearer the node: clear of the labels
      const points = `${x2},${y2} ${mx},${my} ${x1},${y1}`;
      svg.append(svgElement("polyline", {points, class: "edge " + kind, "marker-mid": `url(#arrow-${kind})`}));
    } else {
      svg.append(svgElement("line", {x1, y1, x2, y2, class: "edge " + kind, "marker-end": `url(#arrow-${kind})`}));
    }
  }
}

// ---- the explanation of each step ----------------------------------------------------------------------

/** How one number was computed, written out with the numbers: "h[0,1] = tanh(0.3) = 0.2913". */
function arithmetic(entry) {
  const line = el("div", "entry", el("span", "lhs", entry.label), " = ");
  if (entry.fn) {
    line.append(`${entry.fn}(`, numberElement(entry.arg), ")");
  } else if (entry.mse) {
    line.append("(");
    entry.mse.forEach(([y, t], n) => line.append(n ? " + " : "", "(", numberElement(y), " − ", numberElement(t),
                                                 ")²"));
    line.append(`) / ${entry.mse.length}`);
  } else {
    entry.terms.forEach((factors, n) => {
      if (n) line.append(" + ");
      factors.forEach((f, i) => line.append(i ? " × " : "", numberElement(f, n > 0 || i > 0)));
    });
    (entry.minus || []).forEach(factors => {  // subtracted: "W − 1 × 0.25", never "W + (−1) × 0.25"
      line.append(" − ");
      factors.forEach((f, i) => line.append(i ? " × " : "", numberElement(f, true)));
    });
  }
  if (entry.fn || entry.mse || entry.terms.length) line.append(" = ");
  line.append(numberElement(entry.result));
  return line;
}

/** The entries laid out as their tensor is: one column per column of a matrix, where the lines are short enough. */
function entriesGrid(step) {
  const grid = el("div", "entries", ...step.entries.map(arithmetic));
  const shape = walk.tensors[step.entries[0].result[0]].shape;
  const short = step.entries.every(e => arithmetic(e).textContent.length <= 80);
  grid.style.gridTemplateColumns = `repeat(${shape.length === 2 && short ? shape[1] : 1}, max-content)`;
  return grid;
}

/** Entries that are each one product downstream x local, as tables with those two columns (two side by side
 *  when there are more than four). */
function productTables(step) {
  const half = step.entries.length > 4 ? Math.ceil(step.entries.length / 2) : step.entries.length;
  const tables = el("div", "tables", productTable(step, step.entries.slice(0, half)));
  if (half < step.entries.length) tables.append(productTable(step, step.entries.slice(half)));
  return tables;
}

function productTable(step, entries) {
  const table = el("table", "products");
  const head = el("tr", "", el("th", "", ""));
  for (const c of [step.columns[0], "", step.columns[1], "", "= " + step.formula.split(" = ")[0]])
    head.append(el("th", "", c));
  table.append(el("thead", "", head));
  const body = el("tbody", "");
  for (const e of entries) {
    const [down, local] = e.terms[0];
    body.append(el("tr", "", el("td", "lhs", e.label), el("td", "", numberElement(down)), el("td", "op", "×"),
                   el("td", "", numberElement(local)), el("td", "op", "="), el("td", "", numberElement(e.result))));
  }
  table.append(body);
  return table;
}

function heading(step) {
  if (step.phase === "start") return "Start";
  if (step.phase === "update") return "Update: one SGD step";
  const phase = step.phase === "forward" ? "Forward" : "Backward";
  return `${phase}, step ${step.number} of ${step.of}`;
}

/** The exercise a step belongs to: the commands that write it and derive it. */
function exerciseLine(step) {
  if (!step.exercise) return "";
  const code = text => el("code", "", text);
  return el("span", "exercise", "Exercise: ", code(`python -m learn start ${step.exercise}`), " ",
            code(`python -m learn why ${step.exercise}`));
}

/** The update: the new weights in three columns, then the new loss and its change, one line each. */
function updateGrid(step) {
  const params = step.entries.filter(e => e.result[0].endsWith("_new") && e.result[0] !== "loss_new");
  const grid = el("div", "entries", ...params.map(arithmetic));
  grid.style.gridTemplateColumns = "repeat(3, max-content)";
  const rest = step.entries.filter(e => !params.includes(e)).map(e => el("div", "loss-line", arithmetic(e)));
  return el("div", "", grid, ...rest);
}

// Each step in words above the graph, and its arithmetic, number by number, below it.
const stepsBox = document.getElementById("steps"), workBox = document.getElementById("work");
walk.steps.forEach((step, k) => {
  const words = el("div", "step " + step.phase,
                   el("h2", "", heading(step), step.formula ? el("span", "formula", step.formula) : "",
                      exerciseLine(step)),
                   el("p", "explain", step.text));
  const work = el("div", "work " + step.phase);
  if (step.entries.length) {
    const title = step.phase === "backward" ? "Downstream × local, entry by entry"
                : step.phase === "update" ? "Each weight minus lr times its gradient, then the loss again"
                : `${step.formula}, entry by entry`;
    work.append(el("h3", "", title), step.phase === "update" ? updateGrid(step)
                                     : step.columns ? productTables(step) : entriesGrid(step));
  }
  for (const e of [words, work]) {
    e.dataset.step = k;
    e.dataset.only = "";  // shown at its own step only
  }
  stepsBox.append(words);
  workBox.append(work);
});

// ---- walking: Next and Back, and the predict-first mode ------------------------------------------------

const nextButton = document.getElementById("next"), backButton = document.getElementById("back");
const predictBox = document.getElementById("predict");
const ask = document.getElementById("ask"), guess = document.getElementById("guess");
const verdict = document.getElementById("verdict");

/** The walk as frames: one per step, and in predict-first mode a question before each backward step. */
function framesFor(predict) {
  return walk.steps.flatMap((s, k) => predict && s.phase === "backward" ? [{step: k, asking: true},
                                                                          {step: k, asking: false}]
                                                                        : [{step: k, asking: false}]);
}
let frames = framesFor(false), at = 0;

function render() {
  const {step, asking} = frames[at];
  const shown = e => {
    const k = Number(e.dataset.step);
    return "only" in e.dataset ? k === step && !asking : k < step || (k === step && !asking);
  };
  document.querySelectorAll("[data-step]").forEach(e => e.classList.toggle("unrevealed", !shown(e)));
  for (const node of walk.nodes) {
    const box = boxes[node.id];
    box.classList.toggle("pending", revealedAt[`${node.id}/value`] > step);
    box.classList.toggle("current", walk.steps[step].node === node.id);
  }
  const s = walk.steps[step];
  document.body.classList.toggle("backward-now", s.phase === "backward");
  ask.hidden = !asking;
  stepsBox.hidden = asking;
  if (asking) {
    const hint = s.entries[0].terms.length ? " The downstream gradient is on the page already; the local " +
                                             "derivative is yours to work out." : "";
    document.getElementById("ask-question").textContent = `${heading(s)}: your turn. What is ` +
      `${s.entries[0].label}?${hint} Type your answer and press Check, or press Next to see it.`;
    guess.value = "";
    verdict.textContent = "";
    verdict.className = "";
  }
  backButton.disabled = at === 0;
  nextButton.disabled = at === frames.length - 1;
  document.getElementById("progress").textContent = `${at + 1} / ${frames.length}`;
  drawEdges(step, asking);
  if (asking) guess.focus();
}

/** Right when the guess agrees with the value to 3 significant digits (within one unit of the third). */
function agrees(typed, value) {
  const unit = value === 0 ? 1e-12 : 10 ** (Math.floor(Math.log10(Math.abs(value))) - 2);
  return Math.abs(typed - value) <= unit;
}

document.getElementById("ask-form").addEventListener("submit", event => {
  event.preventDefault();
  const s = walk.steps[frames[at].step], typed = Number(guess.value.trim().replace("−", "-"));
  if (guess.value.trim() === "" || Number.isNaN(typed)) {
    verdict.textContent = "Type a number, such as -0.0123.";
    verdict.className = "";
  } else if (agrees(typed, lookup(s.ask))) {
    verdict.textContent = "Right. Press Next to see every entry.";
    verdict.className = "right";
  } else {
    const known = (s.mistakes || []).find(m => agrees(typed, m.value));
    verdict.textContent = known ? `Not quite: ${known.says}. Try again, or press Next to see the answer.`
                                : "Not quite. Look again at the downstream gradient and the local derivative, " +
                                  "or press Next to see the answer.";
    verdict.className = "wrong";
  }
});

function go(delta) {
  at = Math.min(Math.max(at + delta, 0), frames.length - 1);
  render();
}
nextButton.addEventListener("click", () => go(1));
backButton.addEventListener("click", () => go(-1));
predictBox.addEventListener("change", () => {
  const step = frames[at].step;  // stay on this step, shown: questions start from the next one
  frames = framesFor(predictBox.checked);
  at = frames.findIndex(f => f.step === step && !f.asking);
  render();
});
document.addEventListener("keydown", event => {
  if (event.target instanceof HTMLInputElement && event.target.type === "text") return;
  if (event.key === "ArrowRight") go(1);
  if (event.key === "ArrowLeft") go(-1);
});
window.addEventListener("resize", render);
render();
