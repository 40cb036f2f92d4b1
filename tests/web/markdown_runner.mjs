// Runs the web face's Markdown renderer (src/halfpi/web/app.js) in node for
// tests/web/test_markdown.py: reads a JSON array of Markdown texts on stdin,
// prints, per text, the parsed tree and the DOM that toDom builds from it in
// a recording document (every call it makes is kept, so a test sees exactly
// which elements and attributes exist — and that nothing else was called).
import { readFileSync } from "node:fs";

const source = readFileSync(process.argv[2], "utf8");
const app = await import("data:text/javascript;base64," + Buffer.from(source).toString("base64"));

class Node {
  constructor(kind, tag, text) {
    this.kind = kind;
    this.tag = tag;
    this.text = text;
    this.attrs = {};
    this.children = [];
  }
  setAttribute(name, value) { this.attrs[name] = String(value); }
  appendChild(child) {
    if (child.kind === "fragment") this.children.push(...child.children);
    else this.children.push(child);
    return child;
  }
  toJSON() {
    if (this.kind === "text") return { text: this.text };
    return { tag: this.tag, attrs: this.attrs, children: this.children };
  }
}

const doc = {
  createElement: (tag) => new Node("element", tag),
  createTextNode: (text) => new Node("text", null, text),
  createDocumentFragment: () => new Node("fragment"),
};

const input = JSON.parse(readFileSync(0, "utf8"));
const out = input.map((text) => {
  const tree = app.parseMarkdown(text);
  const dom = app.toDom(tree, doc);
  return { tree, dom: dom.children };
});
process.stdout.write(JSON.stringify(out));
