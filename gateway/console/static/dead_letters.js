// botgw console, dead letters: a button with data-confirm (purge the selection) asks before its form is sent
// (console.js asks for whole forms with data-confirm; this form also replays, which needs no question).
"use strict";
document.addEventListener("click", (event) => {
  const button = event.target.closest && event.target.closest("button[data-confirm]");
  if (button && !window.confirm(button.dataset.confirm)) event.preventDefault();
});
