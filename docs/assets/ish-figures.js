// Draws every view figure of a docs page (tools/docs_figures.py writes the placeholders:
// a div.ish-figure and its plotly JSON in script.ish-figure-data) with the local
// plotly.js loaded just before this file. No network: the figure's JSON is inline.
(function () {
  for (const data of document.querySelectorAll("script.ish-figure-data")) {
    const target = document.getElementById(data.dataset.for);
    const figure = JSON.parse(data.textContent);
    Plotly.newPlot(target, figure.data || [], figure.layout || {}, {
      responsive: true,
      displaylogo: false,
    });
  }
})();
